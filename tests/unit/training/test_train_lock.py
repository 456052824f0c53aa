"""Two `train` runs into one output folder at the same time: the second is refused, naming the first's pid,
and the first's metrics stay its own (before, both ran and metrics.jsonl held every step twice)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.errors import BusyError
from roboloop.fsutil import lock_path_for
from roboloop.training.config import TrainConfig
from roboloop.training.train import train


def test_a_second_run_into_the_same_folder_is_refused(tmp_path):
    src = generate_v21(tmp_path / "v21", GenSpec(num_episodes=2, min_length=10, max_length=12, cameras={}, seed=2))
    ds = convert(src, tmp_path / "v3", ConvertConfig(progress=False))
    out = tmp_path / "run"
    cfg = TrainConfig(dataset=str(ds), output_dir=str(out), steps=400, max_tokens=256, checkpoint_every_steps=0,
                      with_video=False, model_overrides={"horizon": 4, "dim": 32, "head_dim_model": 32})
    code = ("import sys; from roboloop.training.config import TrainConfig; from roboloop.training.train import train;"
            " train(TrainConfig.model_validate_json(sys.argv[1]))")
    log = tmp_path / "first.log"
    with open(log, "w") as f:
        first = subprocess.Popen([sys.executable, "-c", code, cfg.model_dump_json()], stdout=f, stderr=f)
    try:
        deadline = time.time() + 120
        while not (out / "metrics.jsonl").exists() and time.time() < deadline and first.poll() is None:
            time.sleep(0.2)
        assert first.poll() is None, log.read_text()[-2000:]
        assert lock_path_for(out.absolute()).exists()
        with pytest.raises(BusyError, match=f"pid {first.pid}"):
            train(cfg)
        assert first.wait(timeout=300) == 0, log.read_text()[-2000:]
    finally:
        first.kill()
        first.wait()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # one run's rows, once each
    assert not lock_path_for(out.absolute()).exists()
