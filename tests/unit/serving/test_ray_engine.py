"""`roboloop serve --engine ray`: the same wire protocol, token and answers, from a Ray Serve application."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from websockets.exceptions import InvalidStatus

from roboloop.policies import load_policy
from roboloop.policies.obs import Obs
from roboloop.serving import wire
from roboloop.serving.check import LISTENING
from roboloop.serving.client import PolicyClient
from roboloop.serving.token import read_token
from tests.models import untrained_model
from tests.processes import in_session

pytestmark = pytest.mark.slow


def test_ray_serve_engine_answers_like_in_process(tmp_path):
    pytest.importorskip("ray.serve")
    model = untrained_model(tmp_path / "m", 6, 3, 8)
    token = read_token(tmp_path / "token", create=True)
    env = {**os.environ, "ROBOLOOP_SERVE_TOKEN_FILE": str(tmp_path / "token"), "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "roboloop.cli", "serve", str(model), "--engine", "ray", "--port",
                             "0", "--max-connections", "3", "--idle-timeout", "3"], stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        port, seen, deadline = None, [], time.time() + 240
        while port is None and time.time() < deadline:
            line = proc.stderr.readline()
            seen.append(line)
            if m := LISTENING.search(line):
                port = int(m.group(1))
            assert line or proc.poll() is None, "".join(seen[-30:])
        assert port, "".join(seen[-30:])
        state = np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32)
        local = load_policy(model, seed=0)
        with PolicyClient(f"serve://127.0.0.1:{port}", token=token) as c:
            for _ in range(2):
                r = c.act(state)
                # the same noise stream; sums may be ordered differently with another thread count
                assert np.allclose(r.actions, local.act(Obs(torch.from_numpy(state), {}, [""] * 3)).numpy(),
                                   atol=1e-5, rtol=0)
            c.ws.send(b"\x92\x01")
            assert "not a msgpack message" in wire.loads(c.ws.recv(timeout=30))["error"]
            assert c.act(state).actions.shape == (3, 8, 3)
        with pytest.raises(InvalidStatus):
            PolicyClient(f"serve://127.0.0.1:{port}", token="wrong" * 8)
        _idle_connections_are_capped_and_closed(port, token, state)
    finally:
        # SIGTERM (what Kubernetes, systemd and a cancelled run send) stops Ray Serve and Ray itself: nothing of the
        # server's session is left (Ray's C++ signal handler once ended the server in the middle of its shutdown and
        # Ray's dashboard and runtime-env agents outlived it)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
            deadline = time.time() + 20
            while in_session(proc.pid) and time.time() < deadline:
                time.sleep(0.5)
            left = in_session(proc.pid)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.stderr.close()
    assert code == 143 and not left, (code, left)



def _idle_connections_are_capped_and_closed(port: int, token: str, state: np.ndarray) -> None:
    """The process engine's limits, on Ray Serve too: 3 idle authenticated connections fill the replica's cap (a
    fourth is refused at the handshake), and after the idle timeout (3 s) they are closed and an honest client is
    served again (256 of them used to lock every client out)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = f"ws://127.0.0.1:{port}"
    idle = [connect(url, additional_headers={"Authorization": f"Bearer {token}"}) for _ in range(3)]
    time.sleep(0.5)  # each is accepted by the replica (counted) once its handshake is through
    with pytest.raises(InvalidStatus):
        PolicyClient(f"serve://127.0.0.1:{port}", token=token)
    time.sleep(4.0)
    for ws in idle:
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=5)
    with PolicyClient(f"serve://127.0.0.1:{port}", token=token) as c:
        assert c.act(state).actions.shape == (3, 8, 3)
