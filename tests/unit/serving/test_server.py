"""The policy server over real loopback websockets: parity with in-process, tokens, bad input, batching."""

from __future__ import annotations

import os
import stat
import threading
import time

import numpy as np
import pytest
import torch
from websockets.exceptions import ConnectionClosedError, InvalidStatus
from websockets.sync.client import connect

from roboloop.policies import load_policy
from roboloop.policies.obs import Obs
from roboloop.serving import wire
from roboloop.serving.client import PolicyClient, ServerError
from roboloop.serving.server import ServeConfig, Server
from roboloop.serving.token import read_token
from tests.models import untrained_model

TOKEN = "t" * 32
CAM = "observation.images.front"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return untrained_model(tmp_path_factory.mktemp("serve") / "m", 6, 3, 8, cameras=(CAM,))


@pytest.fixture
def server(model):
    with Server(ServeConfig(str(model), port=0, max_wait_ms=5.0), TOKEN) as srv:
        yield srv


def _obs(n: int, seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype(np.float32), {CAM: rng.integers(0, 256, (n, 48, 64, 3), dtype=np.uint8)}


def _url(srv: Server) -> str:
    return f"serve://127.0.0.1:{srv.port}"


def test_served_chunks_equal_in_process_chunks(server, model):
    state, images = _obs(4)
    local = load_policy(model, seed=0)
    obs = Obs(torch.from_numpy(state), {k: torch.from_numpy(v) for k, v in images.items()}, ["pick"] * 4)
    with PolicyClient(_url(server), token=TOKEN) as c:
        info = c.info()
        assert info["camera_keys"] == [CAM] and info["horizon"] == 8 and info["action_dim"] == 3
        for _ in range(3):  # the same noise stream on both sides, call after call
            r = c.act(state, images, ["pick"] * 4)
            assert r.actions.shape == (4, 8, 3) and r.actions.dtype == np.float32
            assert np.array_equal(r.actions, local.act(obs).numpy())
            assert r.version.startswith("m+") and r.infer_ms > 0 and r.roundtrip_ms >= r.infer_ms


def test_tokens_are_required_and_compared(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        with pytest.raises(InvalidStatus) as e:
            connect(f"ws://127.0.0.1:{server.port}", additional_headers=headers)
        assert e.value.response.status_code == 401
    with PolicyClient(_url(server), token=TOKEN) as c:  # still serving
        assert c.act(*_obs(1)).actions.shape == (1, 8, 3)


def test_token_file_is_created_private_and_refused_when_readable(tmp_path):
    f = tmp_path / "tok"
    t = read_token(f, create=True)
    assert len(t) >= 32 and stat.S_IMODE(f.stat().st_mode) == 0o600 and read_token(f) == t
    os.chmod(f, 0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        read_token(f)
    with pytest.raises(FileNotFoundError, match="no policy-server token"):
        read_token(tmp_path / "absent")


def _raw(srv: Server):
    return connect(f"ws://127.0.0.1:{srv.port}", additional_headers={"Authorization": f"Bearer {TOKEN}"},
                   max_size=None)


def test_bad_input_gets_an_error_reply_and_everyone_keeps_being_served(server):
    state, images = _obs(2)
    good = PolicyClient(_url(server), token=TOKEN)
    bad_messages = [
        b"\x92\x01",  # truncated / not a map
        wire.dumps({"type": "act", "id": 1, "state": state[:, :5], "images": images}),
        wire.dumps({"type": "act", "id": 2, "state": state, "images": {}}),
        wire.dumps({"type": "act", "id": 3, "state": state, "images": {CAM: images[CAM][..., :1]}}),
        wire.dumps({"type": "act", "id": 4, "state": state.astype(np.int64), "images": images}),
        wire.dumps({"type": "act", "id": 5, "state": np.full((2, 6), np.nan, np.float32), "images": images}),
        wire.dumps({"type": "act", "id": 6, "state": state, "images": images, "instructions": ["only one"]}),
        wire.dumps({"type": "act", "id": 7, "state": np.zeros((1000, 6), np.float32), "images": {}}),
        wire.dumps({"type": "jump", "id": 8}),
        wire.dumps({"type": "act", "id": 9, "state": state, "images": images, "past": [{"state": state}]}),
    ]
    expected = ["not a msgpack message", "expected an (N, 6) array", "camera 'observation.images.front' missing",
                "expected (2, H, W, 3) uint8", "finite floats", "finite floats", "expected 2 strings", "1000 rows",
                "unknown message type", "past[0].images: camera"]
    rng = np.random.default_rng(1)
    with _raw(server) as ws:
        for msg, what in zip(bad_messages, expected, strict=True):
            ws.send(msg)
            reply = wire.loads(ws.recv(timeout=30))
            assert reply["type"] == "error" and what in reply["error"], reply
            assert good.act(state, images).actions.shape == (2, 8, 3)
        for i in range(300):
            ws.send(rng.integers(0, 256, int(rng.integers(1, 200)), dtype=np.uint8).tobytes())
            assert wire.loads(ws.recv(timeout=30))["type"] == "error"
            if i % 50 == 0:
                assert good.act(state, images).actions.shape == (2, 8, 3)
        ws.send("a text frame")
        assert "text frame" in wire.loads(ws.recv(timeout=30))["error"]
    with _raw(server) as ws:  # 100 MB: this connection is closed (1009), nobody else's
        ws.send(b"\0" * (100 << 20))
        with pytest.raises(ConnectionClosedError) as e:
            ws.recv(timeout=30)
        assert e.value.rcvd is not None and e.value.rcvd.code == 1009
    assert good.act(state, images).actions.shape == (2, 8, 3)
    with pytest.raises(ServerError, match="expected an \\(N, 6\\) array"):
        good.act(np.zeros((1, 4), np.float32), images={CAM: images[CAM][:1]})
    good.close()
    assert server.errors >= 300


def test_concurrent_clients_are_batched(model):
    with Server(ServeConfig(str(model), port=0, max_batch=64, max_wait_ms=20.0), TOKEN) as srv:
        clients = [PolicyClient(_url(srv), token=TOKEN) for _ in range(8)]
        barrier, batches, errors = threading.Barrier(8), [], []

        def go(c: PolicyClient, seed: int) -> None:
            try:
                for _ in range(4):
                    barrier.wait(30)
                    r = c.act(*_obs(1, seed))
                    assert r.actions.shape == (1, 8, 3) and np.isfinite(r.actions).all()
                    batches.append(r.batch)
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=go, args=(c, i)) for i, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for c in clients:
            c.close()
    assert not errors and len(batches) == 32
    assert max(batches) > 1 and srv.batcher.passes < 32  # requests shared forward passes


def test_a_lone_session_never_waits_for_company(model):
    """The batch wait is for other sessions that are acting: one robot is answered at once, every time (a wait of
    2 s would show in each round trip), and a second client that connected but stopped asking is no company."""
    with Server(ServeConfig(str(model), port=0, max_batch=64, max_wait_ms=2000.0), TOKEN) as srv, \
            PolicyClient(_url(srv), token=TOKEN) as c, PolicyClient(_url(srv), token=TOKEN) as idle:
        idle.act(*_obs(1, 1))  # once, then idle for longer than a session counts as acting
        time.sleep(1.2)
        trips = [c.act(*_obs(1, seed)).roundtrip_ms for seed in range(5)]
    assert max(trips) < 1500, trips


def test_the_model_loads_checks_and_acts_on_one_thread_and_swaps_load_on_a_passing_one(model, monkeypatch):
    """PyTorch's OpenMP gives every thread that starts a parallel region its own team of workers; more of them than
    cores and the workers are woken by the kernel for every region (`compute_thread`). So the serving model's load,
    check and forward passes share one thread, and a swap's load and check run on a thread that ends with them."""
    import roboloop.serving.service as service_mod

    loaded: list[threading.Thread] = []

    def recording(load):
        def load_slot(*a, **kw):
            loaded.append(threading.current_thread())
            return load(*a, **kw)
        return load_slot

    monkeypatch.setattr(service_mod, "load_slot", recording(service_mod.load_slot))
    with Server(ServeConfig(str(model), port=0), TOKEN) as srv:
        compute = srv.service.compute.submit(threading.current_thread).result()
        assert loaded == [compute] and compute is not threading.main_thread()
        acted: list[tuple[threading.Thread, bool]] = []
        policy = srv.service.slot.policy
        act = policy.act
        monkeypatch.setattr(policy, "act", lambda obs: (acted.append((threading.current_thread(),
                                                                      torch.is_inference_mode_enabled())), act(obs))[1])
        with PolicyClient(_url(srv), token=TOKEN) as c:
            for n in (1, 3):
                assert c.act(*_obs(n)).actions.shape == (n, 8, 3)
        assert acted and set(acted) == {(compute, True)}  # every pass on that thread, in torch's inference mode
        assert srv.service.swap_to(model, "again")
        assert len(loaded) == 2 and loaded[1] is not compute and not loaded[1].is_alive()


def test_a_client_that_drops_its_connection_is_one_log_line_and_the_server_keeps_serving(server, caplog):
    """A robot that loses power or its network closes no websocket: the server says so in one line (no traceback
    from the connection handler) and serves everyone else."""
    import logging
    import socket

    state, images = _obs(1)
    with caplog.at_level(logging.INFO):
        gone = PolicyClient(_url(server), token=TOKEN)
        assert gone.act(state, images).actions.shape == (1, 8, 3)
        gone.ws.socket.shutdown(socket.SHUT_RDWR)  # the TCP connection ends without a close frame
        gone.ws.socket.close()
        with PolicyClient(_url(server), token=TOKEN) as c:
            for _ in range(20):
                if any("went away without closing" in r.getMessage() for r in caplog.records):
                    break
                assert c.act(state, images).actions.shape == (1, 8, 3)
    assert any("went away without closing" in r.getMessage() for r in caplog.records), caplog.text
    assert not [r for r in caplog.records if r.name == "websockets.server" and r.levelno >= logging.ERROR]


def test_a_server_that_dies_as_it_accepts_is_named_as_lost():
    """The socket accepted, then closed before any HTTP answer (a server killed as a client connected: CI once saw an
    evaluation die with websockets' bare exception instead): ServerLostError naming the URL."""
    import socket
    import threading

    from roboloop.serving.client import PolicyClient, ServerLostError

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def accept_and_die() -> None:
            conn, _ = listener.accept()
            conn.recv(1024)  # the client's upgrade request, never answered
            conn.close()

        threading.Thread(target=accept_and_die, daemon=True).start()
        with pytest.raises(ServerLostError, match=f"no policy server answers at ws://127.0.0.1:{port} "):
            PolicyClient(f"serve://127.0.0.1:{port}", token="t", timeout=10)
