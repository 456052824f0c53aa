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
            "metrics": {"final_loss": 0.1}, "eval": {"successes": successes, "episodes": episodes}}


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
    assert registry.promote("reach", v1).promoted  # first one: no champion yet
    worse = registry.register("reach", _model(tmp_path, "2"), _lineage(50))
    d = registry.promote("reach", worse, margin=0.05)
    assert not d.promoted and "champion 80/100" in d.reason
    al, _ = registry.aliases("reach")
    assert al["champion"] == v1 and al["challenger"] == worse
    better = registry.register("reach", _model(tmp_path, "3"), _lineage(92))
    assert registry.promote("reach", better).promoted
    assert registry.resolve("reach", "champion") == better
    assert [x["version"] for x in registry.aliases("reach")[0]["decisions"]] == [v1, worse, better]


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
