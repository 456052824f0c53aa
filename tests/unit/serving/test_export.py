"""ONNX export of roboloop's VLA: onnxruntime's chunks equal PyTorch's (within the stated tolerance), the export is
served like a model folder, and it refuses what it cannot do."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from roboloop.policies import load_policy
from roboloop.policies.obs import Obs
from roboloop.serving.client import PolicyClient
from roboloop.serving.export import TOLERANCE, OnnxPolicy, export_onnx
from roboloop.serving.server import ServeConfig, Server
from tests.models import untrained_model

CAM = "observation.images.top"
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    model = untrained_model(root / "m", 18, 4, 8, state_std=2.0, action_std=3.0, cameras=(CAM,))
    meta = export_onnx(model, root / "onnx", instruction="reach the red ball")
    return model, root / "onnx", meta


def _obs(n: int, seed: int, instruction: str = "reach the red ball") -> Obs:
    g = torch.Generator().manual_seed(seed)
    return Obs(torch.randn(n, 18, generator=g) * 2, {CAM: torch.randint(0, 256, (n, 96, 128, 3), generator=g,
                                                                        dtype=torch.uint8)}, [instruction] * n)


def test_onnx_chunks_match_pytorch(exported):
    model, onnx_dir, meta = exported
    assert meta["max_abs_diff"] <= TOLERANCE and meta["inference_steps"] >= 1 and meta["camera_keys"] == [CAM]
    torch_policy, onnx_policy = load_policy(model, seed=3), OnnxPolicy(onnx_dir, seed=3)
    for seed in range(3):  # the same noise stream: row by row, PyTorch and onnxruntime give the same chunk
        obs = _obs(1, seed)
        a, b = torch_policy.act(obs), onnx_policy.act(obs)
        assert a.shape == b.shape == (1, 8, 4)
        assert torch.allclose(a, b, atol=TOLERANCE * 3 * 10, rtol=0)  # x action std (3), a margin for the resize
    with pytest.raises(ValueError, match="exported for the instruction 'reach the red ball'"):
        onnx_policy.act(_obs(1, 0, "reach the blue ball"))


def test_the_export_is_served(exported):
    _, onnx_dir, _ = exported
    with Server(ServeConfig(str(onnx_dir), port=0), "o" * 32) as srv, \
            PolicyClient(f"serve://127.0.0.1:{srv.port}", token="o" * 32) as c:
        assert c.info()["runtime"] == "OnnxPolicy"
        obs = _obs(2, 5)
        r = c.act(obs.state.numpy(), {CAM: obs.images[CAM].numpy()}, obs.instructions)
        assert r.actions.shape == (2, 8, 4) and np.isfinite(r.actions).all()
        assert np.allclose(r.actions, OnnxPolicy(onnx_dir).act(obs).numpy(), atol=1e-5)


def test_export_refuses_other_families_and_leaves_nothing(tmp_path):
    d = tmp_path / "lerobot-model"
    d.mkdir()
    (d / "policy.json").write_text(json.dumps({"family": "lerobot", "state_key": "observation.state",
                                               "action_key": "action", "state_dim": 6, "action_dim": 6,
                                               "horizon": 10}))
    (d / "config.json").write_text(json.dumps({"type": "diffusion"}))
    with pytest.raises(ValueError, match="LeRobot's diffusion is not exported to ONNX .its denoising loop"):
        export_onnx(d, tmp_path / "out")
    assert not (tmp_path / "out").exists()
