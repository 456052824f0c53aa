"""A registration whose reply is lost: the store commits the version's COMMITTED.json, the connection drops before
the reply reaches roboloop, botocore sends the conditional PUT again, and the store answers 412 (the object is
there: ours). Through a TCP proxy in front of moto's S3 server that swallows exactly that reply."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import uuid
from pathlib import Path

from roboloop.registry import Registry


class ReplyEater:
    """Forwards every connection to `upstream`; the first time a request PUTs a key containing `word`, the server's
    reply to it is dropped and the client's connection closed (the write happened; the writer never hears)."""

    def __init__(self, upstream: tuple[str, int], word: bytes):
        self.upstream, self.word, self.eaten = upstream, word, 0
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.srv.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            state = {"eat": False}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        try:
            while data := client.recv(65536):
                if data.startswith(b"PUT ") and self.word in data.split(b"\r\n", 1)[0] and not self.eaten:
                    state["eat"] = True
                server.sendall(data)
        except OSError:
            pass

    def _down(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        try:
            while data := server.recv(65536):
                if state["eat"] and data.startswith(b"HTTP/1.1 100"):  # "send the body": not yet the reply
                    interim, _, data = data.partition(b"\r\n\r\n")
                    client.sendall(interim + b"\r\n\r\n")
                    if not data:
                        continue
                if state["eat"]:
                    self.eaten += 1
                    break
                client.sendall(data)
        except OSError:
            pass
        for s in (client, server):  # shutdown first: a close() alone waits for the other thread's recv, and the
            with contextlib.suppress(OSError):  # client would hear nothing until botocore's 60 s read timeout
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.srv.close()


def test_a_registration_whose_reply_was_lost_is_the_version_it_committed(tmp_path, s3_env, monkeypatch):
    import boto3

    bucket = f"lost-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=bucket)
    host, port = s3_env.split("//", 1)[1].split(":")
    eater = ReplyEater((host, int(port)), b"COMMITTED.json")
    monkeypatch.setenv("ROBOLOOP_S3_ENDPOINT_URL", f"http://127.0.0.1:{eater.port}")
    model = Path(tmp_path / "m")
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "config.json").write_text(json.dumps({"family": "vla"}))
    lineage = {"git_commit": "abc123", "dataset_md5": "d41d8cd98f00b204e9800998ecf8427e.dir", "config": {"lr": 1e-3},
               "metrics": {"final_loss": 0.1}, "eval": {"successes": 1, "episodes": 2}}
    try:
        reg = Registry(f"s3://{bucket}/models")
        v = reg.register("reach", model, lineage)
        assert eater.eaten == 1  # the store committed, the reply never came, the client asked again
        assert v == 1 and reg.versions("reach") == [1]
        assert reg.register("reach", model, lineage) == 2  # and the next one follows
    finally:
        eater.close()
