"""`PolicyClient(host_memory=)`: each request's ~1 MB per 480x640 frame is copied a few times on its way out
(encoding, websocket framing and masking). With glibc's defaults, a client process whose own work allocates no
larger blocks (a robot loop) returns those buffers to the system and faults them in again on every request. The
allocator is process-wide: `roboloop serve` runs in its own process and the client in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

from roboloop.serving.check import start_server
from roboloop.serving.token import read_token
from tests.models import untrained_model

CAM = "observation.images.front"
CLIENT = """
import os, sys
import numpy as np
from roboloop.serving.client import PolicyClient
port, mode, cam = sys.argv[1], sys.argv[2], sys.argv[3]
def faults():
    return int(open(f"/proc/{os.getpid()}/stat").read().split()[9])
rng = np.random.default_rng(0)
state = rng.normal(size=(1, 6)).astype(np.float32)
images = {cam: rng.integers(0, 256, (1, 480, 640, 3), dtype=np.uint8)}
with PolicyClient(f"serve://127.0.0.1:{port}", host_memory=mode) as c:
    print(c.host_memory, file=sys.stderr)
    for _ in range(5):  # the heaps settle
        c.act(state, images, ["reach"])
    before = faults()
    for _ in range(10):
        c.act(state, images, ["reach"])
    print((faults() - before) // 10)
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return untrained_model(tmp_path_factory.mktemp("hostmem") / "m", 6, 3, 8, cameras=(CAM,))


def faults_per_request(port: int, mode: str) -> tuple[int, str]:
    """The client's page faults per request of one 480x640 frame, and what it said it applied."""
    run = subprocess.run([sys.executable, "-c", CLIENT, str(port), mode, CAM], capture_output=True, text=True,
                         check=True, timeout=300)
    return int(run.stdout.split()[-1]), run.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts page faults in /proc")
def test_a_client_keeps_a_frames_buffers_for_the_next_request(model, tmp_path, monkeypatch):
    monkeypatch.setenv("ROBOLOOP_SERVE_TOKEN_FILE", str(tmp_path / "token"))
    read_token(str(tmp_path / "token"), create=True)
    server, port = start_server(str(model), 0, "cpu", 1, "fp32", 120, lambda line: None)
    try:
        client_kept, said = faults_per_request(port, "auto")
        client_system, said_system = faults_per_request(port, "system")
    finally:
        server.kill()
        server.wait(30)
    assert said.startswith("keep (glibc keeps freed blocks") and said_system == "system (host_memory system)"
    # a 480x640x3 frame is 225 pages: with glibc's defaults the client faults in every copy of it again (measured
    # here: ~640 a request); kept, next to none
    assert client_system > 225 and client_kept < client_system // 10, (client_kept, client_system)


def test_a_mode_that_is_not_one_is_refused():
    from roboloop.training import hostmem

    with pytest.raises(ValueError, match="host_memory 'sometimes': one of auto, keep, system"):
        hostmem.apply("sometimes", "cpu")
    assert hostmem.apply("auto", "cpu", auto_keeps=False) == "system (host_memory auto)"
