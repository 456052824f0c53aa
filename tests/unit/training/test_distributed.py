"""Two CPU ranks (gloo, launched through torchrun) train exactly like one process on the same global batch."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.training.config import TrainConfig
from roboloop.training.distributed import torchrun_command
from roboloop.training.train import train


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    src = generate_v21(root / "v21", GenSpec(num_episodes=4, min_length=12, max_length=20,
                                            cameras={"observation.images.top": (32, 32)}, seed=6))
    return convert(src, root / "v3", ConvertConfig(progress=False))


def _losses(out):
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_match_one_rank(v3, tmp_path):
    common = dict(dataset=str(v3), steps=20, lr=2e-3, warmup_steps=5, checkpoint_every_steps=0, num_workers=1,
                  model_overrides={"image_size": [32, 32], "horizon": 8}, device="cpu")
    single = TrainConfig(output_dir=str(tmp_path / "one"), max_tokens=1024, **common)
    train(single)
    double = TrainConfig(output_dir=str(tmp_path / "two"), max_tokens=512, **common)
    cfg_file = tmp_path / "two.json"
    cfg_file.write_text(double.model_dump_json())
    cmd = torchrun_command(str(cfg_file), nproc_per_node=2, rdzv_endpoint=f"127.0.0.1:{_port()}")
    # Watchdog: a deadlocked rank fails the test instead of hanging CI.
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(one) == len(two) == 20
    assert abs(one[-1] - two[-1]) <= 1e-4, (one[-3:], two[-3:])
    assert max(abs(a - b) for a, b in zip(one, two, strict=True)) <= 1e-4
    assert (tmp_path / "two" / "model.safetensors").exists()
