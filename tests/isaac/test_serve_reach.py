"""`roboloop serve` in its own process and `roboloop evaluate --policy serve://...` on the Isaac Lab reach task: the
same per-episode outcomes as the same model evaluated in-process on the same episodes. The SO-101 with its two
cameras is served the same way in its closed loop (tests/isaac/test_so101_task.py: the served episodes' returns equal
the loop's in-process evaluation, every frame across the wire)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from roboloop.serving.check import LISTENING
from tests.models import untrained_model

pytestmark = pytest.mark.isaac
TASK = "Roboloop-Reach-Color-v0"


def _evaluate(policy: str, task: str, episodes: int, out, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "roboloop.cli", "evaluate", "--policy", policy, "--task", task,
                           "--episodes", str(episodes), "--num-envs", str(episodes), "--videos", "0",
                           "--output-dir", str(out)], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "report.json").read_text())


def _dims(task: str) -> tuple[int, int]:
    dims = subprocess.run([sys.executable, "-c", "from roboloop.sim.isaac_tasks import make_cfg; "
                           f"c = make_cfg({task!r}); s = c.action_space; "
                           "print(int(c.observation_space), s if isinstance(s, int) else s.shape[-1])"],
                          capture_output=True, text=True, timeout=300, check=True).stdout.split()
    return int(dims[-2]), int(dims[-1])


# the demo's reach task (state + language): the served episodes end exactly as in-process (return and length too,
# so the same chunks)
@pytest.mark.parametrize("task, cameras, episodes", [(TASK, (), 8)])
def test_evaluation_through_the_server_equals_in_process(tmp_path, task, cameras, episodes):
    state_dim, action_dim = _dims(task)
    model = untrained_model(tmp_path / "m", state_dim, action_dim, 16, cameras=cameras, seed=4)
    env = {**os.environ, "ROBOLOOP_SERVE_TOKEN_FILE": str(tmp_path / "token"), "OMP_NUM_THREADS": "1",
           "ROBOLOOP_CACHE_DIR": str(tmp_path / "cache"), "ROBOLOOP_ARTIFACTS": str(tmp_path / "artifacts")}
    # --threads 1: as the in-process evaluation (OMP_NUM_THREADS=1, one thread each as make test runs), so both sum in
    # the same order
    server = subprocess.Popen([sys.executable, "-m", "roboloop.cli", "serve", str(model), "--port", "0",
                               "--threads", "1"], stderr=subprocess.PIPE, text=True, env=env)
    try:
        port, deadline, seen = None, time.time() + 120, []
        while port is None and time.time() < deadline:
            line = server.stderr.readline()
            seen.append(line)
            if m := LISTENING.search(line):
                port = int(m.group(1))
            assert line or server.poll() is None, "".join(seen)
        assert port, "".join(seen)
        assert re.search(r"batches of up to (64|1) \(", "".join(seen)), "".join(seen)  # measured at start, said
        assert oct((tmp_path / "token").stat().st_mode)[-3:] == "600"
        local = _evaluate(str(model), task, episodes, tmp_path / "local", env)
        served = _evaluate(f"serve://127.0.0.1:{port}", task, episodes, tmp_path / "served", env)
    finally:
        server.terminate()
        server.wait(30)
        server.stderr.close()
    assert served["episodes"] == local["episodes"] == episodes
    keys = ("index", "success", "length", "ret")
    assert [{k: e[k] for k in keys} for e in served["per_episode"]] == \
        [{k: e[k] for k in keys} for e in local["per_episode"]]
    versions = served["served"]["versions"]
    assert len(versions) == 1 and next(iter(versions)).startswith("m+")
    assert served["served"]["chunks"] > 0 and served["served"]["roundtrip_ms_p50"] > 0


def test_the_evaluator_acts_through_one_connection(tmp_path):
    """It asks the server what the model reads (whether the task must observe its scene's state) and then acts on
    the same connection: one session on the server, not one more for the question."""
    from roboloop.serving.server import ServeConfig, Server
    from roboloop.serving.token import read_token

    model = untrained_model(tmp_path / "m", *_dims(TASK), 16, seed=4)
    env = {**os.environ, "ROBOLOOP_SERVE_TOKEN_FILE": str(tmp_path / "token"),
           "ROBOLOOP_CACHE_DIR": str(tmp_path / "cache"), "ROBOLOOP_ARTIFACTS": str(tmp_path / "artifacts")}
    with Server(ServeConfig(str(model), port=0), read_token(str(tmp_path / "token"), create=True)) as srv:
        proc = subprocess.run([sys.executable, "-m", "roboloop.cli", "evaluate", "--policy",
                               f"serve://127.0.0.1:{srv.port}", "--task", TASK, "--episodes", "2", "--num-envs", "2",
                               "--videos", "0", "--output-dir", str(tmp_path / "served")],
                              capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert srv.connections == 1 and srv.errors == 0
    assert json.loads((tmp_path / "served" / "report.json").read_text())["episodes"] == 2
