"""A rank that hangs inside a step (SIGSTOP: alive and silent) is found by its heartbeat and killed by the other rank
(roboloop.training.hang), and torchrun restarts both from the last checkpoint, long before the collective timeout
(120 s here) would have noticed; the run ends finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roboloop.training.config import TrainConfig

pytestmark = pytest.mark.slow


def _beat(out: Path, rank: int) -> dict | None:
    try:
        return json.loads((out / ".heartbeat" / f"rank-{rank}.json").read_text())
    except (OSError, ValueError):
        return None


def test_a_stopped_rank_is_killed_by_its_peer_and_the_run_restarts(tiny_v3, tmp_path):
    out = tmp_path / "run"
    cfg = TrainConfig(dataset=str(tiny_v3), output_dir=str(out), steps=30, checkpoint_every_steps=5, num_workers=1,
                      max_tokens=256, model_overrides={"image_size": [32, 32], "horizon": 8}, device="cpu")
    (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ROBOLOOP_HANG_TIMEOUT_S": "3"}
    with open(tmp_path / "train.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "roboloop.cli", "train", "--config", str(tmp_path / "cfg.json"),
                                 "--nproc-per-node", "2", "--max-restarts", "1", "--collective-timeout-s", "120"],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not ((b := _beat(out, 1)) and b["step"] >= 12 and b["phase"] == "step"):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "train.log").read_text()[-3000:]
            time.sleep(0.005)
        os.kill(b["pid"], signal.SIGSTOP)
        t0 = time.monotonic()
        while not ((b2 := _beat(out, 1)) and b2["pid"] != b["pid"] and b2["phase"] in ("step", "between")):
            assert time.monotonic() - t0 < 60, (tmp_path / "train.log").read_text()[-3000:]
            time.sleep(0.05)
        healed = time.monotonic() - t0
        assert proc.wait(300) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = (tmp_path / "train.log").read_text()
    assert "rank 1 (pid" in text and "made no progress in step" in text, text[-3000:]
    assert healed < 40, healed  # the collective timeout alone: 120 s, and torchrun's 30 s grace for a stopped rank
    assert (out / "model.safetensors").exists()


def test_a_first_step_is_left_to_the_collective_timeout_and_a_later_one_is_judged(tmp_path, monkeypatch):
    """A rank's first step after a (re)start compiles and initialises (a compiled FSDP step on a busy machine took
    over 60 s and was killed as hung): only a step with a median behind it is judged."""
    from roboloop.training.hang import Heartbeat

    monkeypatch.setenv("ROBOLOOP_HANG_TIMEOUT_S", "1")
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watcher = Heartbeat(tmp_path, 0)
        old = {"rank": 1, "pid": peer.pid, "host": watcher.host, "step": 0, "phase": "step",
               "time": time.time() - 30}
        watcher._judge({**old, "step_s": None})
        assert peer.poll() is None and watcher.killed == []  # 30 s inside its first step: not judged
        watcher._judge({**old, "step": 5, "step_s": 0.1})
        assert peer.wait(10) == -signal.SIGKILL and watcher.killed == [peer.pid]
    finally:
        peer.kill()
        peer.wait()
