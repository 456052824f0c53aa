"""tasks/control_plane.py: which failures of the Prefect API are ridden out, on real sockets (the cluster test
stops PostgreSQL and the server under a running loop: tests/cluster/test_cluster_loop.py)."""

from __future__ import annotations

import http.server
import logging
import socket
import threading
import time

import httpx
import pytest

from tasks.control_plane import api_fault, ride_out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Answer(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


def _get(port: int) -> int:
    r = httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2)
    r.raise_for_status()
    return r.status_code


def test_a_server_down_then_up_is_ridden_out_and_said(caplog):
    port = _free_port()
    server = http.server.HTTPServer(("127.0.0.1", port), _Answer, bind_and_activate=False)

    def later() -> None:  # nothing listens for the first second (connection refused), then the server answers
        time.sleep(1.0)
        server.server_bind()
        server.server_activate()
        server.serve_forever()

    t = threading.Thread(target=later, daemon=True)
    t.start()
    try:
        with caplog.at_level(logging.WARNING):
            t0 = time.monotonic()
            assert ride_out(lambda: _get(port), "polling", logging.getLogger("t"), grace_s=30, pause_s=0.2) == 200
        assert time.monotonic() - t0 >= 0.9
        said = [r.getMessage() for r in caplog.records]
        assert said[0].startswith("polling: the Prefect API failed (ConnectError") and "30 s" in said[0], said
        assert said[-1].startswith("polling: the Prefect API answers again after"), said
    finally:
        server.shutdown()


@pytest.mark.parametrize("status, ridden", [(500, True), (503, True), (404, False), (401, False), (409, False)])
def test_server_errors_are_ridden_out_and_refusals_are_not(status, ridden):
    port = _free_port()
    handler = type("H", (_Answer,), {"status": status})
    server = http.server.HTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        calls = []

        def call() -> int:
            calls.append(1)
            return _get(port)

        with pytest.raises((httpx.HTTPStatusError, RuntimeError)) as e:
            ride_out(call, "polling", logging.getLogger("t"), grace_s=0.5, pause_s=0.1)
        assert (api_fault(e.value.__cause__ or e.value) is not None) == ridden
        assert (len(calls) > 1) == ridden, calls  # a refusal is raised at once, a server error asked again
        if ridden:
            assert isinstance(e.value, RuntimeError) and "ROBOLOOP_CONTROL_PLANE_GRACE_S=0.5" in str(e.value)
    finally:
        server.shutdown()
