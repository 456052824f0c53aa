"""ONNX export of LeRobot's ACT trained by roboloop on a LeRobot-written dataset with two cameras at different
resolutions (one stored as images in the parquet): onnxruntime's chunks (with LeRobot's own processors around
the graph) equal LeRobot's PyTorch policy's, and `roboloop serve EXPORT` serves them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roboloop.policies.obs import Obs
from tests.conformance.cases import LEROBOT_QUIET, lerobot_writer

pytestmark = LEROBOT_QUIET
pytest.importorskip("onnxruntime")
CAMS = {"observation.images.front": (32, 48)}  # a video
IMAGES = {"observation.image": (24, 24)}  # stored as images in the parquet
ACT = {"dim_model": 32, "dim_feedforward": 64, "n_encoder_layers": 1, "n_decoder_layers": 1, "n_heads": 2,
       "latent_dim": 8, "chunk_size": 5, "n_action_steps": 5}


def act_export(root):
    from roboloop.serving.export import export_onnx
    from roboloop.training.config import TrainConfig
    from roboloop.training.train import train

    lerobot_writer(CAMS, IMAGES, ["pick the cube"], num_episodes=2)(root / "ds")
    train(TrainConfig(dataset=str(root / "ds"), output_dir=str(root / "m"), policy_type="act", policy_config=ACT,
                      steps=2, max_samples=4, warmup_steps=1, checkpoint_every_steps=0, num_workers=1))
    meta = export_onnx(root / "m", root / "onnx")
    return root / "m", root / "onnx", meta


def _obs(n: int, seed: int, state_dim: int) -> Obs:
    g = torch.Generator().manual_seed(seed)
    images = {k: torch.randint(0, 256, (n, 2 * h, 2 * w, 3), generator=g, dtype=torch.uint8)  # resized by the policy
              for k, (h, w) in {**CAMS, **IMAGES}.items()}
    return Obs(torch.randn(n, state_dim, generator=g), images, ["pick the cube"] * n)


def check_chunks(act_export) -> None:
    from roboloop.policies.lerobot import LeRobotPolicy
    from roboloop.serving.export import TOLERANCE, open_export

    model, onnx_dir, meta = act_export
    assert meta["family"] == "lerobot" and meta["policy_type"] == "act" and meta["max_abs_diff"] <= TOLERANCE
    assert list(meta["inputs"])[0] == "observation.state" and set(meta["inputs"]) == {"observation.state", *CAMS,
                                                                                        *IMAGES}
    assert meta["inputs"]["observation.image"] == [1, 3, 24, 24]  # each camera at its own resolution
    assert meta["inputs"]["observation.images.front"] == [1, 3, 32, 48]
    assert not (onnx_dir / "model.safetensors").exists()  # the graph replaces the weights
    torch_policy, onnx_policy = LeRobotPolicy(model), open_export(onnx_dir)
    assert type(onnx_policy).__name__ == "OnnxLeRobotPolicy" and onnx_policy.policy is None
    for seed in range(3):
        obs = _obs(2, seed, torch_policy.state_dim)
        a, b = torch_policy.act(obs), onnx_policy.act(obs)
        assert a.shape == b.shape == (2, 5, torch_policy.action_dim)
        scale = float(np.max(torch_policy.stats["action"]["std"]))
        assert torch.allclose(a, b, atol=TOLERANCE * scale * 10, rtol=0), float((a - b).abs().max())


def check_served(act_export) -> None:
    from roboloop.serving.client import PolicyClient
    from roboloop.serving.export import open_export
    from roboloop.serving.server import ServeConfig, Server

    _, onnx_dir, _ = act_export
    local = open_export(onnx_dir)
    with Server(ServeConfig(str(onnx_dir), port=0), "a" * 32) as srv, \
            PolicyClient(f"serve://127.0.0.1:{srv.port}", token="a" * 32) as c:
        assert c.info()["runtime"] == "OnnxLeRobotPolicy"
        obs = _obs(2, 7, local.state_dim)
        r = c.act(obs.state.numpy(), {k: v.numpy() for k, v in obs.images.items()}, obs.instructions)
        assert r.actions.shape == (2, 5, local.action_dim)
        assert np.allclose(r.actions, local.act(obs).numpy(), atol=1e-5)


def run_checks(root: str) -> None:
    """The checks above, in a child process (`test_act_export`): onnxruntime's and LeRobot's thread pools must not
    be in the pytest process when later tests fork worker pools."""
    from pathlib import Path

    exported = act_export(Path(root))
    check_chunks(exported)
    check_served(exported)
    print("act-export-ok")


def test_act_export(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    p = subprocess.run([sys.executable, "-c", "import sys; from tests.unit.serving.test_export_act import run_checks; "
                        "run_checks(sys.argv[1])", str(tmp_path)], cwd=repo, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(repo)})
    assert p.returncode == 0 and "act-export-ok" in p.stdout, p.stderr[-4000:]
