"""LeRobot's ACT on two CPU ranks (gloo, through `roboloop train --nproc-per-node 2 --strategy fsdp`): FSDP2, one
unit per encoder/decoder layer, trains as one process does on the same global batch, writes DCP shards, and the
final folder is what LeRobot's `from_pretrained` reads (the shards gathered into full weights). DDP's wrapper and
the restart from DCP shards are the VLA's (tests/unit/training/test_distributed.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from roboloop.training.config import TrainConfig
from roboloop.training.train import train
from tests.conformance.cases import LEROBOT_QUIET, lerobot_writer
from tests.unit.training.test_distributed import _losses, _port

pytestmark = [*LEROBOT_QUIET, pytest.mark.slow]

# Deterministic: no dropout and no VAE sampling, so the ranks' RNG streams cannot differ from one process's. A
# one-step chunk has no padding: ACT divides its loss by the valid steps of the batch it sees, and under DDP (as
# under lerobot-train's accelerate) each rank divides by its own, so with padded chunks two ranks' mean loss is
# not exactly one process's.
ACT = {"dim_model": 32, "dim_feedforward": 64, "n_encoder_layers": 1, "n_decoder_layers": 1, "n_heads": 2,
       "chunk_size": 1, "n_action_steps": 1, "dropout": 0.0, "use_vae": False}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "roboloop.cli", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_act_on_two_fsdp_ranks_trains_like_one(tmp_path):
    from lerobot.policies.act.modeling_act import ACTPolicy

    ds = tmp_path / "ds"
    lerobot_writer({"observation.images.front": (24, 32)}, {}, ["pick the cube"], num_episodes=3)(ds)
    one = TrainConfig(dataset=str(ds), output_dir=str(tmp_path / "one"), policy_type="act", policy_config=ACT,
                      steps=8, max_samples=4, lr=1e-3, warmup_steps=1, checkpoint_every_steps=0, num_workers=1,
                      device="cpu")
    train(one)
    ref = _losses(tmp_path / "one")
    out = tmp_path / "fsdp"
    cfg = TrainConfig(**{**one.model_dump(), "output_dir": str(out), "max_samples": 2, "strategy": "fsdp",
                         "checkpoint_every_steps": 4})
    (tmp_path / "fsdp.json").write_text(cfg.model_dump_json())
    args = ("train", "--config", str(tmp_path / "fsdp.json"), "--nproc-per-node", "2")
    proc = _cli(*args, "--rdzv-endpoint", f"127.0.0.1:{_port()}")
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-4000:]
    got = _losses(out)
    assert len(got) == 8 and max(abs(a - b) for a, b in zip(ref, got, strict=True)) <= 1e-4, (ref, got)
    ACTPolicy.from_pretrained(str(out))  # strict: every weight at its full shape
    assert (out / "checkpoints" / "step-00000004" / ".metadata").exists()  # DCP shards
