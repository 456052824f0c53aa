"""Registry on a local folder and on a real moto S3 server: lineage, atomic versions, CAS promotion."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from roboloop.registry import Registry, RegistryError


def _model(tmp_path, tag: str, size: int = 1000):
    d = tmp_path / f"model-{tag}"
    d.mkdir()
    (d / "model.safetensors").write_bytes(os.urandom(size))
    (d / "config.json").write_text(json.dumps({"tag": tag}))
    return d


def _lineage(successes: int, episodes: int = 100) -> dict:
    return {"git_commit": "abc123", "dataset_md5": "d41d8cd98f00b204e9800998ecf8427e.dir", "config": {"lr": 1e-3},
            "metrics": {"final_loss": 0.1}, "eval": {"successes": successes, "episodes": episodes},
            "baseline_eval": {"successes": 0, "episodes": 16, "policy": "random"}}


@pytest.fixture(params=["local", "s3"])
def registry(request, tmp_path):
    if request.param == "local":
        return Registry(tmp_path / "registry")
    s3_env = request.getfixturevalue("s3_env")
    import boto3

    bucket = f"reg-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=bucket)
    return Registry(f"s3://{bucket}/models")


def test_register_show_download_roundtrip(registry, tmp_path):
    src = _model(tmp_path, "a")
    v = registry.register("reach", src, _lineage(80))
    assert v == 1 and registry.versions("reach") == [1]
    info = registry.show("reach", 1)
    assert info["lineage"]["git_commit"] == "abc123" and set(info["files"]) == {"model.safetensors", "config.json"}
    out = registry.download("reach", "v1", tmp_path / "dl")
    assert (out / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert json.loads((out / "lineage.json").read_text())["eval"]["successes"] == 80


def test_version_without_lineage_is_refused(registry, tmp_path):
    with pytest.raises(RegistryError, match="lineage lacks git_commit, dataset_md5"):
        registry.register("reach", _model(tmp_path, "x"), {"config": {}, "metrics": {"a": 1}})
    assert registry.versions("reach") == []


def test_promotion_gate(registry, tmp_path):
    v1 = registry.register("reach", _model(tmp_path, "1"), _lineage(80))
    d = registry.promote("reach", v1)  # first one: it must beat the random baseline
    assert d.promoted and d.reason.startswith("first version 80/100 vs random baseline 0/16, unpaired"), d.reason
    worse = registry.register("reach", _model(tmp_path, "2"), _lineage(50))
    d = registry.promote("reach", worse, margin=0.05)
    assert not d.promoted and "champion 80/100" in d.reason
    al, _ = registry.aliases("reach")
    assert al["champion"] == v1 and al["challenger"] == worse
    better = registry.register("reach", _model(tmp_path, "3"), _lineage(92))
    assert registry.promote("reach", better).promoted
    assert registry.resolve("reach", "champion") == better
    assert [x["version"] for x in registry.aliases("reach")[0]["decisions"]] == [v1, worse, better]


def _paired(outcomes: str, seed: int = 0) -> dict:
    lin = _lineage(outcomes.count("1"), len(outcomes))
    lin["eval"].update({"task": "Roboloop-Reach-Color-v0", "seed": seed, "execute_steps": 4, "outcomes": outcomes})
    return lin


def test_promotion_gate_pairs_the_same_episodes(tmp_path):
    """On the same numbered episodes the gate sees which episodes changed: one lost success out of 60 passes the
    paired gate, while the unpaired test on 47/60 vs 48/60 cannot tell it from a 20-point drop."""
    from roboloop.binomial import non_inferior

    registry = Registry(tmp_path / "registry")
    champ = "1" * 48 + "0" * 12
    assert registry.promote("reach", registry.register("reach", _model(tmp_path, "1"), _paired(champ))).promoted
    near = "0" + champ[1:]  # 47/60: one success lost, nothing else changed
    assert not non_inferior(47, 60, 48, 60, 0.05, 0.05)[0]
    d = registry.promote("reach", registry.register("reach", _model(tmp_path, "2"), _paired(near)), margin=0.05)
    assert d.promoted and d.reason.startswith("paired over 60 episodes (1 discordant)") and "not worse" in d.reason
    # two more lost: undecided, and the reason says how many paired episodes would decide it
    d = registry.promote("reach", registry.register("reach", _model(tmp_path, "3"), _paired("000" + champ[3:])))
    assert not d.promoted and "undecided; about" in d.reason and "paired episodes would decide it" in d.reason, d.reason
    # a real drop (37/60 vs 47/60 on the same episodes): worse
    d = registry.promote("reach", registry.register("reach", _model(tmp_path, "4"), _paired("0" * 11 + champ[11:])))
    assert not d.promoted and d.reason.endswith("worse"), d.reason
    # another seed's episodes cannot be paired: the two-proportion test decides, says so, and at 60 episodes
    # it cannot even pass 48/60 against 47/60
    d = registry.promote("reach", registry.register("reach", _model(tmp_path, "5"), _paired(champ, seed=1)))
    assert d.reason.startswith("unpaired (not the same episodes)") and not d.promoted, d.reason
    assert registry.resolve("reach", "champion") == 2


def test_a_first_version_must_beat_the_random_baseline_on_the_same_episodes(tmp_path):
    """No champion is no evidence: a 0% first model (or 2/16 against random's 1/16) is registered, not promoted;
    without a baseline at all it is not promoted either, unless forced."""
    registry = Registry(tmp_path / "registry")

    def lin(model: str, random: str | None) -> dict:
        out = _paired(model)
        out["baseline_eval"] = None if random is None else {
            "successes": random.count("1"), "episodes": len(random), "task": "Roboloop-Reach-Color-v0", "seed": 0,
            "execute_steps": 4, "outcomes": random, "policy": "random"}
        return out

    d = registry.promote("reach", registry.register("reach", _model(tmp_path, "0"), lin("0" * 50, "0" * 16)))
    assert not d.promoted and "not shown better than the baseline" in d.reason, d.reason
    assert registry.aliases("reach")[0].get("champion") is None
    d = registry.promote("reach", registry.register("reach", _model(tmp_path, "1"), lin("01" + "0" * 48,
                                                                                          "1" + "0" * 15)))
    assert not d.promoted, d.reason
    assert d.reason.startswith("first version 1/50 vs random baseline 1/16, paired over 16"), d.reason
    d = registry.promote("reach", registry.register("reach", _model(tmp_path, "2"), lin("1" * 50, None)))
    assert not d.promoted and "no baseline" in d.reason, d.reason
    d = registry.promote("reach", registry.register("reach", _model(tmp_path, "3"), lin("1" * 12 + "0" * 38,
                                                                                          "0" * 16)))
    assert d.promoted and "paired over 16 episodes: +0.750" in d.reason, d.reason
    assert registry.promote("reach", 2, force=True).promoted  # a person may still decide


def test_outcomes_that_disagree_with_the_counts_are_refused(tmp_path):
    from roboloop.registry import CorruptVersionError

    registry = Registry(tmp_path / "registry")
    registry.promote("reach", registry.register("reach", _model(tmp_path, "1"), _paired("1" * 10)))
    bad = _paired("1" * 10)
    bad["eval"]["outcomes"] = "1" * 9 + "0"  # 9 successes listed, 10 counted
    v2 = registry.register("reach", _model(tmp_path, "2"), bad)
    with pytest.raises(CorruptVersionError, match="outcomes disagree"):
        registry.promote("reach", v2)


def test_eight_concurrent_promoters_lose_no_update(registry, tmp_path):
    rates = [70, 72, 90, 60, 88, 95, 40, 91]
    results, errors = [], []

    def worker(i: int) -> None:
        try:
            v = registry.register("race", _model(tmp_path, f"r{i}"), _lineage(rates[i]))
            results.append(registry.promote("race", v, margin=0.02))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(registry.versions("race")) == list(range(1, 9))  # 8 distinct versions, none lost
    al, _ = registry.aliases("race")
    chain = al["decisions"]
    assert len(chain) == 8  # every promotion decision recorded
    for prev, cur in zip(chain, chain[1:], strict=False):  # each decided against the champion of its time
        assert cur["champion_before"] == prev["champion_after"]
    assert al["champion"] == chain[-1]["champion_after"]


def test_killed_upload_never_appears(tmp_path, s3_env):
    import boto3

    bucket = f"kill-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/models"
    big = _model(tmp_path, "big", size=1)
    for i in range(40):
        (big / f"shard-{i:02d}.bin").write_bytes(os.urandom(2_000_000))
    code = ("import sys, json; from roboloop.registry import Registry; "
            "Registry(sys.argv[1]).register('reach', sys.argv[2], json.loads(sys.argv[3]))")
    proc = subprocess.Popen([sys.executable, "-c", code, uri, str(big), json.dumps(_lineage(10))],
                            start_new_session=True)
    reg = Registry(uri)
    deadline = time.time() + 60
    while time.time() < deadline and not any("files/shard" in k for k in reg.store.list("reach/")):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    keys = reg.store.list("reach/")
    assert any("claim.json" in k for k in keys)  # it was mid-upload ...
    assert reg.versions("reach") == []  # ... and is not a version
    with pytest.raises(RegistryError):
        reg.resolve("reach", 1)
    assert reg.register("reach", _model(tmp_path, "next"), _lineage(5)) == 2  # the number stays burnt


def test_a_junk_key_is_skipped_with_a_warning_not_fatal_to_every_user(registry, tmp_path, caplog):
    """`versions/vXYZ/COMMITTED.json` (hand-written, or another tool's) broke list, promote and resolve for all."""
    registry.register("reach", _model(tmp_path, "a"), _lineage(80))
    registry.store.put_bytes("reach/versions/vXYZ/COMMITTED.json", b"{}")
    registry.store.put_bytes("reach/versions/v1/claim.json", b"{}")
    with caplog.at_level("WARNING"):
        assert registry.versions("reach") == [1] and registry.models() == ["reach"]
        assert registry.resolve("reach", "v1") == 1
        v = registry.register("reach", _model(tmp_path, "b"), _lineage(90))
    assert v == 2 and registry.versions("reach") == [1, 2]
    assert "skipping reach/versions/vXYZ/COMMITTED.json" in caplog.text


def test_a_link_in_a_model_folder_is_refused_not_followed(registry, tmp_path):
    """A link to a 0600 secret was uploaded and served to every reader as a 0644 file."""
    secret = tmp_path / "secret"
    secret.write_text("hunter2")
    secret.chmod(0o600)
    src = _model(tmp_path, "a")
    (src / "tokenizer.json").symlink_to(secret)
    with pytest.raises(RegistryError, match=r"tokenizer.json is a link \(to .*secret\)"):
        registry.register("reach", src, _lineage(80))
    (src / "tokenizer.json").unlink()
    (src / "extra").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(RegistryError, match="extra is a link"):
        registry.register("reach", src, _lineage(80))
    assert registry.versions("reach") == [] and not registry._claimed("reach")
