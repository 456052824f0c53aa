"""`compile=on` for LeRobot's policies: ACT's encoder and decoder layers and Diffusion's U-Net blocks compiled one
region each (inductor's C++ backend here) train as eager does over 24 steps, dropout included (the compiled blocks
draw from torch's generator as eager does), with no graph break inside a region and no recompile after the first
steps; the run record says what compiled."""

from __future__ import annotations

import json

import pytest

from roboloop.training.config import TrainConfig
from roboloop.training.train import train
from tests.conformance.cases import LEROBOT_QUIET, lerobot_writer

pytestmark = [*LEROBOT_QUIET, pytest.mark.slow]

CAMS = {"observation.images.front": (32, 32)}
CONFIGS = {
    "act": ({"dim_model": 32, "dim_feedforward": 64, "n_encoder_layers": 2, "n_decoder_layers": 1, "n_heads": 2,
             "latent_dim": 8, "chunk_size": 5, "n_action_steps": 5}, 2 + 1 + 4, 3e-4),  # + VAE encoder's 4
    "diffusion": ({"down_dims": [16, 32], "horizon": 8, "n_action_steps": 4, "diffusion_step_embed_dim": 16,
                   "spatial_softmax_num_keypoints": 8, "n_groups": 4, "crop_shape": [28, 28]}, 5 + 2 + 3 + 1,
                  1e-3),
}
STEPS = 24


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("compile") / "ds"
    lerobot_writer(CAMS, {}, ["pick the cube"], num_episodes=3)(root)
    return root


def _run(ds, out, policy_type: str, mode: str) -> list[dict]:
    config, _, tol = CONFIGS[policy_type]
    train(TrainConfig(dataset=str(ds), output_dir=str(out), policy_type=policy_type, policy_config=config,
                      steps=STEPS, max_samples=4, warmup_steps=1, lr=1e-4, checkpoint_every_steps=0,
                      num_workers=1, compile=mode))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("policy_type", ["act", "diffusion"])
def test_compiled_lerobot_policy_trains_as_eager(recorded, tmp_path, policy_type):
    _, regions, tol = CONFIGS[policy_type]
    eager = _run(recorded, tmp_path / "eager", policy_type, "off")
    comp = _run(recorded, tmp_path / "compiled", policy_type, "on")
    rec = comp[0]["run"]["compile"]
    assert rec["compiled"] and rec["regions"] == regions, rec
    gaps = [abs(a["loss"] - b["loss"]) / max(abs(a["loss"]), 1e-6) for a, b in zip(eager, comp, strict=True)]
    assert max(gaps) <= tol, [(a["loss"], b["loss"]) for a, b in zip(eager, comp, strict=True)][-5:]
    last = comp[-1]["compile"]
    assert last["graph_breaks"] == 0, comp[-1]
    assert last["recompiles"] == comp[10]["compile"]["recompiles"], comp[-1]  # none after the first steps
