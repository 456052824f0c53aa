"""`roboloop serve` under abuse, over real loopback sockets: clients that never read, idle and surplus connections,
malformed authentication. For each, an honest client keeps being served within a stated bound, and the abuser
gets one clear refusal or a closed connection."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import psutil
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from roboloop.serving import wire
from roboloop.serving.client import PolicyClient
from roboloop.serving.server import ServeConfig, Server
from tests.models import untrained_model

TOKEN = "a" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HONEST_P99_S = 2.0  # an honest client's slowest round trip while abusers are at work (2 shared cores, CI load)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return untrained_model(tmp_path_factory.mktemp("abuse") / "m", 6, 3, 8)


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):  # 256 rows of 32x32 actions: 1 MB replies fill a socket's buffers in a few
    return untrained_model(tmp_path_factory.mktemp("abuse") / "wide", 6, 32, 32)


def _state(n: int) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(n, 6)).astype(np.float32)


class Honest(threading.Thread):
    """A client acting all along; its round trips and errors are kept."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.stop, self.times, self.errors = port, threading.Event(), [], []

    def run(self) -> None:
        try:
            with PolicyClient(f"serve://127.0.0.1:{self.port}", token=TOKEN) as c:
                while not self.stop.is_set():
                    t0 = time.perf_counter()
                    c.act(_state(1))
                    self.times.append(time.perf_counter() - t0)
                    time.sleep(0.01)
        except Exception as e:  # reported by the test
            self.errors.append(e)

    def finish(self) -> list[float]:
        self.stop.set()
        self.join(30)
        assert not self.errors, self.errors
        assert len(self.times) >= 10
        return self.times


def _small_window_socket(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that never reads fills up fast
    s.connect(("127.0.0.1", port))
    return s


def test_a_client_that_never_reads_is_dropped_and_others_are_served(wide_model):
    cfg = ServeConfig(str(wide_model), port=0, send_timeout_s=1.0, max_wait_ms=0)
    with Server(cfg, TOKEN) as srv:
        honest = Honest(srv.port)
        honest.start()
        ws = connect(f"ws://127.0.0.1:{srv.port}", additional_headers=AUTH, sock=_small_window_socket(srv.port),
                     max_queue=1, max_size=None)
        msg = wire.dumps({"type": "act", "id": 1, "state": _state(256)})
        t0, closed = time.perf_counter(), False
        try:
            while time.perf_counter() - t0 < 60:
                ws.send(msg)
        except (ConnectionClosed, OSError) as e:
            closed = repr(e)

        took = time.perf_counter() - t0
        ws.close_socket()
        times = honest.finish()
        assert closed and srv.dropped == 1, f"still open after {took:.0f} s {closed}"
        assert took < 15
        # the abuser's requests are real work (256 rows, 1 MB replies) that the honest client's wait behind until
        # the abuser is dropped: 3.1 s at p99 once under make test's load (4.0 s the slowest, then 8 ms again), so
        # this bound is the stall detector, not a latency target (bench/serve.py measures latency)
        assert np.percentile(times, 99) < HONEST_P99_S + 3.0
        assert np.median(times[len(times) // 2:]) < 0.5  # and once it is gone, service is back to normal


def test_large_messages_never_read_hold_bounded_memory(model):
    """Four connections sending large messages and never reading held +2.65 GB before (16 queued messages each, the
    replies echoing a large timestamp); now each holds at most `max_queue` + 1 messages and gets a short error."""
    cfg = ServeConfig(str(model), port=0, send_timeout_s=1.0, max_wait_ms=0)
    big = wire.dumps({"type": "act", "id": 1, "timestamp": b"\0" * (8 << 20), "state": _state(1)})
    proc = psutil.Process()
    with Server(cfg, TOKEN) as srv:
        honest = Honest(srv.port)
        honest.start()
        base = proc.memory_info().rss

        def abuse() -> None:
            try:
                with connect(f"ws://127.0.0.1:{srv.port}", additional_headers=AUTH, max_size=None, max_queue=1,
                             sock=_small_window_socket(srv.port)) as ws:
                    for _ in range(10):
                        ws.send(big)
            except (ConnectionClosed, OSError):
                pass

        abusers = [threading.Thread(target=abuse, daemon=True) for _ in range(4)]
        peak = base
        for t in abusers:
            t.start()
        while any(t.is_alive() for t in abusers):
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.05)
        times = honest.finish()
    grew = (peak - base) / 2**20
    # the abusers' own sends are in this process too (4 x 8 MB messages being written, with their masks); before,
    # the server alone held 4 x (10 queued + 1 echoed) x 8 MB = 352 MB
    assert grew < 4 * (2 + 1) * 8 + 4 * 2 * 8 + 100, f"+{grew:.0f} MB"
    assert np.percentile(times, 99) < HONEST_P99_S


def test_idle_and_surplus_connections_are_closed_or_refused(model):
    cfg = ServeConfig(str(model), port=0, idle_timeout_s=0.5, max_connections=3)
    with Server(cfg, TOKEN) as srv:
        url = f"ws://127.0.0.1:{srv.port}"
        idle = connect(url, additional_headers=AUTH)
        with pytest.raises(ConnectionClosed) as e:
            idle.recv(timeout=10)
        assert e.value.rcvd is not None and e.value.rcvd.code == 1001 and "idle_timeout_s" in e.value.rcvd.reason
        open_ = [connect(url, additional_headers=AUTH) for _ in range(3)]
        with pytest.raises(InvalidStatus) as refused:
            connect(url, additional_headers=AUTH)
        assert refused.value.response.status_code == 503
        for ws in open_:
            ws.close()
        deadline = time.time() + 10
        while srv.open_connections and time.time() < deadline:
            time.sleep(0.05)
        with PolicyClient(f"serve://{url[5:]}", token=TOKEN) as c:  # room again
            assert c.act(_state(1)).actions.shape == (1, 8, 3)


@pytest.mark.parametrize("headers", [
    b"Authorization: Bearer " + TOKEN.encode() + b"\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n",
    b"Authorization: Bearer \xff\xfe" + TOKEN.encode() + b"\r\n",
    b"Authorization: \xc3\x28\r\n"])
def test_duplicate_or_undecodable_authorization_is_a_401_not_a_server_error(model, headers):
    with Server(ServeConfig(str(model), port=0), TOKEN) as srv, socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" + headers + b"\r\n")
        s.settimeout(10)
        status = s.recv(4096).split(b"\r\n", 1)[0]
        assert status.startswith(b"HTTP/1.1 401"), status


def test_frames_of_another_shape_than_the_camera_are_refused_and_big_requests_named(tmp_path):
    """1x1 and 3000x3000 frames were resized and served to a model trained on 48x64; now refused, naming the camera
    and the size it was trained on. A request over the server's message limit is refused by the client, naming
    both sizes (the server would close the connection with 1009)."""
    import json

    from roboloop.serving.client import ServerError

    cam = "observation.images.front"
    model = untrained_model(tmp_path / "cam", 6, 3, 8, cameras=(cam,))
    cfg = json.loads((model / "config.json").read_text())
    cfg["data"]["cameras"] = [{"key": cam, "storage": "video", "depth": False, "shape": [48, 64]}]
    (model / "config.json").write_text(json.dumps(cfg))
    with Server(ServeConfig(str(model), port=0, max_message_bytes=28 << 20), TOKEN) as srv, \
            PolicyClient(f"serve://127.0.0.1:{srv.port}", token=TOKEN) as c:
        assert c.spec["camera_sizes"] == {cam: [48, 64]}
        for h, w in ((48, 64), (96, 128), (480, 640)):  # the recorded size, and larger frames of its aspect
            assert c.act(_state(1), {cam: np.zeros((1, h, w, 3), np.uint8)}).actions.shape == (1, 8, 3)
        for h, w in ((1, 1), (3000, 3000), (64, 64), (24, 32)):
            with pytest.raises(ServerError, match=rf"{h}x{w} frames; the model was trained on 48x64"):
                c.act(_state(1), {cam: np.zeros((1, h, w, 3), np.uint8)})
        with pytest.raises(ServerError, match=r"this request is 35.2 MiB and .* takes at most 28.0 MiB"):
            c.act(_state(40), {cam: np.zeros((40, 480, 640, 3), np.uint8)})
        assert c.act(_state(1), {cam: np.zeros((1, 48, 64, 3), np.uint8)}).actions.shape == (1, 8, 3)


def test_settings_of_another_engine_are_refused(model):
    from tests.faults.conftest import run_cli

    r = run_cli("serve", str(model), "--replicas", "2")
    assert r.code != 0 and "--replicas, --replicas-per-node and --ray-address apply to --engine ray only" in r.err
    r = run_cli("serve", str(model), "--replicas-per-node", "1")
    assert r.code != 0 and "apply to --engine ray only" in r.err
    r = run_cli("serve", str(model), "--engine", "ray", "--max-message-mb", "32")
    assert r.code != 0 and "Ray Serve's proxy closes websocket messages over 16 MiB" in r.err


def test_a_slow_client_does_not_slow_a_lone_fast_robot(model):
    """The batcher waited up to max_wait_ms for every session that asked within the last second: a 2 Hz client made
    a fast robot wait on each request (-42% chunks/s). Now it waits only for sessions due by their own cadence."""
    cfg = ServeConfig(str(model), port=0, max_wait_ms=20.0)  # a long wait: a wrong one would show clearly
    with Server(cfg, TOKEN) as srv:
        url = f"serve://127.0.0.1:{srv.port}"

        def fast(seconds: float) -> int:
            n, t0 = 0, time.perf_counter()
            with PolicyClient(url, token=TOKEN) as c:
                while time.perf_counter() - t0 < seconds:
                    c.act(_state(1))
                    n += 1
            return n

        alone = fast(1.5)
        stop = threading.Event()

        def slow() -> None:
            with PolicyClient(url, token=TOKEN) as c:
                while not stop.wait(0.5):
                    c.act(_state(1))

        t = threading.Thread(target=slow, daemon=True)
        t.start()
        time.sleep(1.2)  # it has a cadence
        beside = max(fast(1.5), fast(1.5))  # the better of two windows: a load spike in one (make test: 151 vs 224
        stop.set()  # requests once) is not the slow client's doing; the defect slows both
        t.join(10)
        after = fast(1.5)  # alone again: a machine busier since the first window (make test, once) slows this too
    assert beside >= 0.75 * min(alone, after), (alone, beside, after)
