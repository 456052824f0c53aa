"""Node 0 delivers the finished model to the run store or fails saying so (roboloop.training.runstore
`Mirror.deliver_model`): a store that is unreachable for a while is asked again, a store that stays down fails the job
naming the setting, a model already there is not sent twice. On a real moto S3 server, reached through a port that
refuses connections until the store "comes back"."""

from __future__ import annotations

import time
import uuid

import boto3
import pytest

from roboloop.training.runstore import MODEL_LAST, Mirror, RunStoreError
from tests.netdoor import Door


def _model(root):
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / MODEL_LAST).write_bytes(b"w" * 4096)
    return root


@pytest.fixture
def bucket(s3_env, monkeypatch):
    name = f"dl-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    monkeypatch.setenv("ROBOLOOP_S3_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("ROBOLOOP_S3_CONNECT_TIMEOUT_S", "1")
    return name


def test_a_store_down_for_a_while_gets_the_model_once_it_is_back(tmp_path, bucket, s3_env, monkeypatch):
    door = Door(s3_env, open_after_s=3.0)
    monkeypatch.setenv("ROBOLOOP_S3_ENDPOINT_URL", door.url)
    said: list[str] = []
    try:
        t0 = time.monotonic()
        assert Mirror(f"s3://{bucket}/runs/m-1").deliver_model(_model(tmp_path / "out"), 60, said.append) is True
        assert time.monotonic() - t0 > 2.5, said
        assert said and "trying again in 2 s" in said[0], said
        again = Mirror(f"s3://{bucket}/runs/m-1").deliver_model(tmp_path / "out", 60, said.append)
        assert again is False  # every file there, the same size: not sent twice
    finally:
        door.close()
    s3 = boto3.client("s3", endpoint_url=s3_env)
    got = s3.get_object(Bucket=bucket, Key=f"runs/m-1/{MODEL_LAST}")["Body"].read()
    assert got == b"w" * 4096


def test_a_store_that_stays_down_fails_the_job_naming_the_setting(tmp_path, bucket, monkeypatch):
    door = Door("http://127.0.0.1:9", open_after_s=3600)  # never opens
    monkeypatch.setenv("ROBOLOOP_S3_ENDPOINT_URL", door.url)
    with pytest.raises(RunStoreError, match=r"could not be put in s3://.*ROBOLOOP_STORE_GRACE_S=3.*run the job again"):
        Mirror(f"s3://{bucket}/runs/m-2").deliver_model(_model(tmp_path / "out"), 3, lambda line: None)
    door.close()
