"""Serving `registry:NAME@champion`: a promotion during a run is loaded, checked and swapped in between requests;
a broken new version is refused and the old one keeps serving."""

from __future__ import annotations

import threading
import time

import numpy as np

from roboloop.registry import Registry
from roboloop.serving.client import PolicyClient
from roboloop.serving.server import ServeConfig, Server
from tests.models import untrained_model

TOKEN = "f" * 32


def _lineage(successes: int) -> dict:
    return {"git_commit": "abc123", "dataset_md5": "d41d8cd98f00b204e9800998ecf8427e.dir", "config": {"lr": 1e-3},
            "metrics": {"final_loss": 0.1}, "eval": {"successes": successes, "episodes": 100},
            "baseline_eval": {"successes": 0, "episodes": 16, "policy": "random"}}


def test_promotion_swaps_between_requests_and_a_broken_version_is_refused(tmp_path):
    reg = Registry(tmp_path / "registry")
    a = untrained_model(tmp_path / "a", 6, 3, 8, seed=1)
    b = untrained_model(tmp_path / "b", 6, 3, 8, seed=2)
    broken = untrained_model(tmp_path / "c", 6, 3, 8, seed=3)
    (broken / "model.safetensors").write_bytes(b"\0" * 64)  # registers fine, does not load
    reg.register("arm", a, _lineage(80))
    assert reg.promote("arm", 1).promoted
    state = np.random.default_rng(0).normal(size=(2, 6)).astype(np.float32)
    cfg = ServeConfig(f"registry:{reg.uri}#arm@champion", port=0, follow_interval_s=0.1,
                      cache=str(tmp_path / "cache"))
    with Server(cfg, TOKEN) as srv:
        replies, errors, stop = [], [], threading.Event()

        def robot() -> None:  # a client acting all along
            try:
                with PolicyClient(f"serve://127.0.0.1:{srv.port}", token=TOKEN) as c:
                    while not stop.is_set():
                        replies.append(c.act(state))
            except Exception as e:  # reported below
                errors.append(e)

        t = threading.Thread(target=robot)
        t.start()
        while len(replies) < 5:
            time.sleep(0.05)
        reg.register("arm", b, _lineage(85))
        assert reg.promote("arm", 2).promoted
        deadline = time.time() + 60
        while not replies[-1].version.startswith("arm@v2+") and time.time() < deadline:
            time.sleep(0.05)
        n_swapped = len(replies)
        reg.register("arm", broken, _lineage(90))
        assert reg.promote("arm", 3).promoted
        while "arm@v3 refused" not in replies[-1].note and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        stop.set()
        t.join(30)
    assert not errors, errors
    versions = [r.version.split("+")[0] for r in replies]
    first_v2 = versions.index("arm@v2")
    assert set(versions[:first_v2]) == {"arm@v1"} and set(versions[first_v2:]) == {"arm@v2"}  # one swap, no mix
    assert n_swapped > first_v2 and len(replies) > n_swapped  # served before, between and after
    assert "arm@v3 refused" in replies[-1].note and "CorruptFileError" in replies[-1].note
    assert all(np.isfinite(r.actions).all() and r.actions.shape == (2, 8, 3) for r in replies)
    # each version's chunks come from its own weights: v1's and v2's differ
    assert not np.array_equal(replies[0].actions, replies[-1].actions)


def test_a_promoted_version_with_violent_actions_never_reaches_a_connected_robot(tmp_path):
    """The gate judges success rates, not what a model tells the motors: a version whose actions leave the
    champion's training range (its dataset's action statistics) by more than a quarter of it is refused at the swap,
    and the champion keeps serving. Its own stats.json, which claims the wider range, is not what it is judged by."""
    reg = Registry(tmp_path / "registry")
    reg.register("arm", untrained_model(tmp_path / "a", 6, 3, 8, seed=1), _lineage(80))
    assert reg.promote("arm", 1).promoted
    violent = untrained_model(tmp_path / "v", 6, 3, 8, seed=2, action_std=500.0)
    state = np.random.default_rng(0).normal(size=(1, 6)).astype(np.float32)
    cfg = ServeConfig(f"registry:{reg.uri}#arm@champion", port=0, follow_interval_s=0.1,
                      cache=str(tmp_path / "cache"))
    with Server(cfg, TOKEN) as srv, PolicyClient(f"serve://127.0.0.1:{srv.port}", token=TOKEN) as c:
        first = c.act(state)
        reg.register("arm", violent, _lineage(95))
        assert reg.promote("arm", 2).promoted  # the gate lets it through
        deadline = time.time() + 60
        replies = [c.act(state)]
        while "arm@v2 refused" not in replies[-1].note and time.time() < deadline:
            replies.append(c.act(state))
    assert "outside arm@v1" in replies[-1].note and "training range" in replies[-1].note, replies[-1].note
    assert {r.version for r in replies} == {first.version}  # every chunk came from v1
    assert np.abs(np.concatenate([r.actions for r in replies])).max() < 10


def test_two_servers_in_one_directory_keep_their_own_downloads(tmp_path):
    """Each server prunes the versions it no longer serves from its download cache: with one cache, a follower's
    swap deleted the folder a pinned server beside it was serving."""
    reg = Registry(tmp_path / "registry")
    reg.register("arm", untrained_model(tmp_path / "a", 6, 3, 8, seed=1), _lineage(80))
    assert reg.promote("arm", 1).promoted
    cache = str(tmp_path / "cache")
    follower = ServeConfig(f"registry:{reg.uri}#arm@champion", port=0, follow_interval_s=0.1, cache=cache)
    pinned = ServeConfig(f"registry:{reg.uri}#arm@1", port=0, cache=cache)
    with Server(follower, TOKEN) as s1, Server(pinned, TOKEN) as s2:
        assert s1.cache != s2.cache and s1.cache.parent == s2.cache.parent
        reg.register("arm", untrained_model(tmp_path / "b", 6, 3, 8, seed=2), _lineage(85))
        assert reg.promote("arm", 2).promoted
        deadline = time.time() + 60
        while not s1.service.slot.version.startswith("arm@v2") and time.time() < deadline:
            time.sleep(0.1)
        assert s1.service.slot.version.startswith("arm@v2")
        while (s1.cache / "arm" / "v000001").exists() and time.time() < deadline:  # its own v1 pruned
            time.sleep(0.1)
        assert (s2.cache / "arm" / "v000001" / "model.safetensors").is_file()
    with Server(pinned, TOKEN) as s3:  # a server started later takes the first free cache again
        assert s3.cache == s1.cache
