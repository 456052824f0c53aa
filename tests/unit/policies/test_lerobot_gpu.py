"""LeRobot's ACT on CUDA through roboloop's engine: colour frames travel as uint8 through the pinned side-stream
copy and are scaled on the GPU; with the same weights and the same first batch the GPU's first loss is the CPU's
(ACT's VAE sampling and dropout off, so nothing random differs between the two devices), and the lookahead that
`auto` turns on for CUDA is recorded as what ran."""

from __future__ import annotations

import json
import math

import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.training.config import TrainConfig
from roboloop.training.train import train
from tests.conformance.cases import LEROBOT_QUIET

pytestmark = [pytest.mark.gpu, *LEROBOT_QUIET]

ACT = {"dim_model": 32, "dim_feedforward": 64, "n_encoder_layers": 1, "n_decoder_layers": 1, "n_heads": 2,
       "latent_dim": 8, "chunk_size": 5, "n_action_steps": 5, "use_vae": False, "dropout": 0.0}


@pytest.fixture(scope="module")
def cameras_v3(tmp_path_factory):
    """Two videos at their own sizes and one camera stored as images in the parquet."""
    root = tmp_path_factory.mktemp("act_gpu")
    spec = GenSpec(num_episodes=3, min_length=16, max_length=20, seed=5,
                   cameras={"observation.images.top": (32, 48), "observation.images.wrist": (24, 32)},
                   image_keys={"observation.images.gripper": (16, 16)})
    return convert(generate_v21(root / "v21", spec), root / "v3", ConvertConfig(progress=False))


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_act_on_cuda_starts_where_the_cpu_does(cameras_v3, tmp_path):
    runs = {}
    for device in ("cpu", "cuda"):
        train(TrainConfig(dataset=str(cameras_v3), output_dir=str(tmp_path / device), policy_type="act",
                          policy_config=ACT, steps=6, max_samples=4, warmup_steps=1, checkpoint_every_steps=0,
                          num_workers=2, device=device, precision="fp32"))
        runs[device] = _rows(tmp_path / device)
    cpu, gpu = runs["cpu"], runs["cuda"]
    assert cpu[0]["pipeline"] == {"prefetch": True, "lookahead": False}
    assert gpu[0]["pipeline"] == {"prefetch": True, "lookahead": True}
    assert gpu[0]["run"]["device"] != "cpu"
    # cuDNN convolutions may run in TF32: 1% is far inside what a frame scaled twice (or never) would change
    assert math.isclose(gpu[0]["loss"], cpu[0]["loss"], rel_tol=1e-2), (gpu[0]["loss"], cpu[0]["loss"])
    assert all(math.isfinite(r["loss"]) for r in gpu) and len(gpu) == 6
