"""Hostile and incompatible registry versions for a server that follows `champion`: a version that changes the
chunk is served to new connections only (connected robots keep theirs); a request that makes NaN is refused and
never becomes the check a new version must pass; a refused version is tried again; the cache holds only what
is served; a deleted registry is said in every reply; replies carry no server paths."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest

from roboloop.registry import Registry
from roboloop.serving.client import PolicyClient, ServerError
from roboloop.serving.server import ServeConfig, Server
from tests.models import untrained_model

TOKEN = "v" * 32


def _lineage() -> dict:
    return {"git_commit": "abc123", "dataset_md5": "d41d8cd98f00b204e9800998ecf8427e.dir", "config": {"lr": 1e-3},
            "metrics": {"final_loss": 0.1}, "eval": {"successes": 9, "episodes": 10},
            "baseline_eval": {"successes": 0, "episodes": 10, "policy": "random"}}


def _wait(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def served(tmp_path):
    """A registry with v1 (chunks of 8x3) as champion, and a server following it."""
    reg = Registry(tmp_path / "registry")
    reg.register("arm", untrained_model(tmp_path / "v1", 6, 3, 8, seed=1), _lineage())
    assert reg.promote("arm", 1).promoted
    cfg = ServeConfig(f"registry:{reg.uri}#arm@champion", port=0, follow_interval_s=0.05, follow_retry_s=0.3,
                      cache=str(tmp_path / "cache"))
    with Server(cfg, TOKEN) as srv:
        yield reg, srv, f"serve://127.0.0.1:{srv.port}"


STATE = np.random.default_rng(0).normal(size=(2, 6)).astype(np.float32)


def test_a_new_chunk_length_goes_to_new_connections_and_connected_robots_keep_theirs(served, tmp_path):
    reg, srv, url = served
    robot = PolicyClient(url, token=TOKEN)
    assert robot.act(STATE).actions.shape == (2, 8, 3)
    reg.register("arm", untrained_model(tmp_path / "v2", 6, 3, 16, seed=2), _lineage())  # 16x3 chunks
    assert reg.promote("arm", 2, force=True).promoted
    _wait(lambda: srv.service.slot.version.startswith("arm@v2+"), "v2 was not loaded")
    r = robot.act(STATE)  # the connected robot: still v1's 8x3 chunks, told why
    assert r.version.startswith("arm@v1+") and r.actions.shape == (2, 8, 3)
    assert "served to new connections only (chunk length 8 -> 16)" in r.note
    with PolicyClient(url, token=TOKEN) as fresh:
        r2 = fresh.act(STATE)
        assert r2.version.startswith("arm@v2+") and r2.actions.shape == (2, 16, 3) and not r2.note
    assert len(srv.service.lanes) == 2
    robot.close()
    _wait(lambda: len(srv.service.lanes) == 1, "v1 was kept after its last connection closed")
    _wait(lambda: [d.name for d in (srv.cache / "arm").iterdir()] == ["v000002"], "v1's copy was kept")


def test_a_client_refuses_a_chunk_of_another_shape(served):
    _, srv, url = served
    with PolicyClient(url, token=TOKEN) as c:
        c.spec = {**c.spec, "horizon": 16}  # as if the server changed the chunk under this connection
        with pytest.raises(ServerError, match=r"chunk of shape \(2, 8, 3\) .* opened for \(2, 16, 3\)"):
            c.act(STATE)


def test_a_nan_making_request_is_refused_and_never_becomes_the_check(served, tmp_path):
    reg, srv, url = served
    with PolicyClient(url, token=TOKEN) as c:
        assert c.act(STATE).actions.shape == (2, 8, 3)
        extreme = np.full((1, 6), 3e38, np.float32)  # finite, but the model's arithmetic overflows
        with pytest.raises(ServerError, match="non-finite chunk for this observation"):
            c.act(extreme)
        assert np.isfinite(c.act(STATE).actions).all()  # the same connection keeps being served
        with pytest.raises(ServerError, match="non-finite"):
            c.act(np.full((1, 6), 3e38, np.float32))  # the last request seen
        reg.register("arm", untrained_model(tmp_path / "v2", 6, 3, 8, seed=2), _lineage())
        assert reg.promote("arm", 2, force=True).promoted
        _wait(lambda: c.act(STATE).version.startswith("arm@v2+"), "v2 was refused: " + srv.service.refused)


def test_a_refused_version_is_tried_again_and_notes_carry_no_server_paths(served, tmp_path):
    reg, srv, url = served
    reg.register("arm", untrained_model(tmp_path / "v2", 6, 3, 8, seed=2), _lineage())
    stored = next((tmp_path / "registry").rglob("v000002/files/model.safetensors"))
    good = stored.read_bytes()
    stored.write_bytes(b"\0" * 64)  # a copy that went wrong in the store
    assert reg.promote("arm", 2, force=True).promoted
    with PolicyClient(url, token=TOKEN) as c:
        _wait(lambda: "arm@v2 refused" in c.act(STATE).note, "v2 was not refused")
        note = c.act(STATE).note
        assert str(tmp_path) not in note and "checksum" in note, note
        stored.write_bytes(good)  # repaired: the follower tries again
        _wait(lambda: c.act(STATE).version.startswith("arm@v2+"), "v2 was not tried again")
        assert not c.act(STATE).note
        shutil.rmtree(tmp_path / "registry")
        _wait(lambda: "no longer in the registry" in c.act(STATE).note, "a deleted registry went unsaid")
        r = c.act(STATE)
        assert r.version.startswith("arm@v2+") and np.isfinite(r.actions).all()
