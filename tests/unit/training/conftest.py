"""Training fixtures shared by the trainer's test modules."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21


@pytest.fixture(scope="module")
def tiny_v3(tmp_path_factory):
    """Three short episodes with one 32x32 video camera, converted to v3 (read-only: copy before damaging)."""
    root = tmp_path_factory.mktemp("train")
    src = generate_v21(root / "v21", GenSpec(num_episodes=3, min_length=16, max_length=24,
                                            cameras={"observation.images.top": (32, 32)}, seed=4))
    return convert(src, root / "v3", ConvertConfig(progress=False))


def kill9_at_step(cfg, step: int, timeout: float = 300) -> None:
    """Train `cfg` in a child process and kill -9 its process group once its heartbeat reaches `step`."""
    code = ("import sys; from roboloop.training.config import TrainConfig; from roboloop.training.train import train;"
            " train(TrainConfig.model_validate_json(sys.argv[1]))")
    proc = subprocess.Popen([sys.executable, "-c", code, cfg.model_dump_json()], start_new_session=True,
                            stderr=subprocess.DEVNULL)
    hb = Path(cfg.output_dir) / "heartbeat.json"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if hb.exists() and json.loads(hb.read_text())["step"] >= step:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
