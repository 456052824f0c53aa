"""Node 0 delivers the finished model to the run store or fails saying so (roboloop.training.runstore
`Mirror.deliver_model`): a store that is unreachable for a while is asked again, a store that stays down fails the job
naming the setting, a model already there is not sent twice. On a real moto S3 server, reached through a port that
refuses connections until the store "comes back"."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid

import boto3
import pytest

from roboloop.training.runstore import MODEL_LAST, Mirror, RunStoreError


def _model(root):
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / MODEL_LAST).write_bytes(b"w" * 4096)
    return root


class _LateDoor:
    """A TCP port that refuses connections for `closed_s`, then forwards every connection to `target`."""

    def __init__(self, target: str, closed_s: float):
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, args=(closed_s,), daemon=True).start()

    def _serve(self, closed_s: float) -> None:
        time.sleep(closed_s)
        srv = socket.create_server(("127.0.0.1", self.port))
        srv.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            up = socket.create_connection(self.target)
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()
        srv.close()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def bucket(s3_env, monkeypatch):
    name = f"dl-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    monkeypatch.setenv("ROBOLOOP_S3_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("ROBOLOOP_S3_CONNECT_TIMEOUT_S", "1")
    return name


def test_a_store_down_for_a_while_gets_the_model_once_it_is_back(tmp_path, bucket, s3_env, monkeypatch):
    door = _LateDoor(s3_env, closed_s=3.0)
    monkeypatch.setenv("ROBOLOOP_S3_ENDPOINT_URL", f"http://127.0.0.1:{door.port}")
    said: list[str] = []
    try:
        t0 = time.monotonic()
        assert Mirror(f"s3://{bucket}/runs/m-1").deliver_model(_model(tmp_path / "out"), 60, said.append) is True
        assert time.monotonic() - t0 > 2.5, said
        assert said and "trying again in 2 s" in said[0], said
        again = Mirror(f"s3://{bucket}/runs/m-1").deliver_model(tmp_path / "out", 60, said.append)
        assert again is False  # every file there, the same size: not sent twice
    finally:
        door.stop.set()
    s3 = boto3.client("s3", endpoint_url=s3_env)
    got = s3.get_object(Bucket=bucket, Key=f"runs/m-1/{MODEL_LAST}")["Body"].read()
    assert got == b"w" * 4096


def test_a_store_that_stays_down_fails_the_job_naming_the_setting(tmp_path, bucket, monkeypatch):
    door = _LateDoor("http://127.0.0.1:9", closed_s=3600)  # never opens
    monkeypatch.setenv("ROBOLOOP_S3_ENDPOINT_URL", f"http://127.0.0.1:{door.port}")
    with pytest.raises(RunStoreError, match=r"could not be put in s3://.*ROBOLOOP_STORE_GRACE_S=3.*run the job again"):
        Mirror(f"s3://{bucket}/runs/m-2").deliver_model(_model(tmp_path / "out"), 3, lambda line: None)
    door.stop.set()
