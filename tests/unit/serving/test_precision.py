"""`roboloop serve --precision bf16`: forward passes under bf16 autocast where the CPU multiplies bf16 natively.
Served bf16 chunks equal the same model's in-process bf16 chunks (its weights cast once give exactly what
`torch.autocast` gives the fp32 model), stay near its fp32 ones (the start-up check
measures how near), for roboloop's VLA and LeRobot's ACT and Diffusion; where bf16 would be emulated, or the
model is an ONNX export, it is refused with the reason."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from roboloop import availability
from roboloop.availability import MissingCapability
from roboloop.policies import load_policy
from roboloop.policies.obs import Obs
from roboloop.serving.client import PolicyClient
from roboloop.serving.server import ServeConfig, Server
from roboloop.serving.service import load_slot
from tests.conformance.cases import LEROBOT_QUIET, lerobot_writer
from tests.models import untrained_model

pytestmark = LEROBOT_QUIET
TOKEN = "p" * 32
CAMS = {"observation.images.front": (32, 48)}
NATIVE = availability.cpu_bf16() is not None
needs_bf16 = pytest.mark.skipif(not NATIVE, reason="this CPU has neither AMX nor AVX512-BF16")
CONFIGS = {"act": {"dim_model": 32, "dim_feedforward": 64, "n_encoder_layers": 1, "n_decoder_layers": 1,
                   "n_heads": 2, "latent_dim": 8, "chunk_size": 5, "n_action_steps": 5},
           "diffusion": {"down_dims": [16, 32], "horizon": 8, "n_action_steps": 4, "diffusion_step_embed_dim": 16,
                         "spatial_softmax_num_keypoints": 8, "num_inference_steps": 2, "n_groups": 4}}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from roboloop.training.config import TrainConfig
    from roboloop.training.train import train

    root = tmp_path_factory.mktemp("precision")
    out = {"vla": untrained_model(root / "vla", 6, 3, 8, cameras=tuple(CAMS))}
    lerobot_writer(CAMS, {}, ["pick the cube"], num_episodes=2)(root / "ds")
    for kind, cfg in CONFIGS.items():
        train(TrainConfig(dataset=str(root / "ds"), output_dir=str(root / kind), policy_type=kind, policy_config=cfg,
                          steps=1, max_samples=4, warmup_steps=1, checkpoint_every_steps=0, num_workers=1))
        out[kind] = root / kind
    return out


def _obs(policy, n: int, seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, policy.state_dim)).astype(np.float32),
            {k: rng.integers(0, 256, (n, 48, 72, 3), dtype=np.uint8) for k in policy.camera_keys})  # 1.5x, resized


@needs_bf16
@pytest.mark.parametrize("kind", ["vla", "act", "diffusion"])
def test_served_bf16_chunks_are_the_in_process_bf16_chunks_and_near_fp32(models, kind):
    fp32, autocast = load_policy(models[kind], seed=0), load_policy(models[kind], seed=0)
    bf16 = load_policy(models[kind], seed=0, precision="bf16")
    assert bf16.state_dim == fp32.state_dim and bf16.camera_keys == fp32.camera_keys  # the policy's attributes
    assert bf16.policy is not fp32
    # cast once where that gives autocast's chunks; not Diffusion, which draws its noise in its weights' dtype
    assert (bf16.weights_cast > 0) == (kind != "diffusion")
    with Server(ServeConfig(str(models[kind]), port=0, precision="bf16"), TOKEN) as srv:
        slot = srv.service.slot
        assert slot.precision == "bf16 (" + availability.cpu_bf16() + ")"
        worst, scale = slot.deviation  # measured by the start-up check
        # Diffusion's denoising steps carry bf16's rounding further (6% of its largest action here, 0.7% for ACT)
        tol = 0.15 if kind == "diffusion" else 0.05
        assert 0 < worst <= tol * max(scale, 1.0), slot.deviation
        with PolicyClient(f"serve://127.0.0.1:{srv.port}", token=TOKEN) as c:
            info = c.info()
            assert info["precision"].startswith("bf16") and info["runtime"] == type(fp32).__name__
            assert info["bf16_deviation"] == [worst, scale]
            for seed in range(2):
                state, images = _obs(fp32, 2, seed)
                obs = Obs(torch.from_numpy(state), {k: torch.from_numpy(v) for k, v in images.items()},
                          ["pick the cube"] * 2)
                r = c.act(state, images, ["pick the cube"] * 2)
                torch.manual_seed(seed)  # Diffusion's noise: torch's global generator (the VLA has its own)
                here = bf16.act(obs)
                assert here.dtype == torch.float32 and r.actions.shape == tuple(here.shape)
                if kind != "diffusion":  # the same noise on both sides, call after call
                    assert np.array_equal(r.actions, here.numpy())
                with torch.autocast("cpu", dtype=torch.bfloat16):  # weights cast once = cast every call
                    torch.manual_seed(seed)
                    assert torch.equal(here, autocast.act(obs).float())
                torch.manual_seed(seed)
                ref = fp32.act(obs)
                assert not torch.equal(here, ref)  # bf16 really ran
                assert float((here - ref).abs().max()) <= tol * max(float(ref.abs().max()), 1.0)
        if kind == "vla":  # a swapped-in version acts in the server's precision too
            assert srv.service.swap_to(models["act"], "act")
            new = srv.service.slot
            assert new.version.startswith("act+") and new.precision.startswith("bf16") and new.deviation
            assert new.policy.weights_cast > 0

def test_bf16_is_refused_where_the_cpu_would_emulate_it_and_for_an_onnx_export(models, monkeypatch, tmp_path):
    monkeypatch.setattr(availability, "cpu_bf16", lambda: None)
    with pytest.raises(MissingCapability, match="neither AMX nor AVX512-BF16"):
        load_policy(models["vla"], precision="bf16")
    with pytest.raises(MissingCapability, match="neither AMX nor AVX512-BF16"):
        load_slot(models["act"], "act", precision="bf16")
    with pytest.raises(ValueError, match="precision 'fp16'"):
        load_policy(models["vla"], precision="fp16")
    monkeypatch.undo()
    pytest.importorskip("onnxruntime")
    from roboloop.serving.export import export_onnx

    export_onnx(models["vla"], tmp_path / "onnx")
    with pytest.raises(ValueError, match="ONNX export runs on onnxruntime as exported"):
        load_slot(tmp_path / "onnx", "onnx", precision="bf16")
    assert load_slot(tmp_path / "onnx", "onnx").precision == "fp32"


@needs_bf16
def test_roboloop_serve_says_its_precision_and_how_far_from_fp32(models, tmp_path):
    """The real CLI: the start-up line names bf16, the instructions behind it and its measured deviation."""
    env = {**os.environ, "ROBOLOOP_SERVE_TOKEN_FILE": str(tmp_path / "token")}
    p = subprocess.Popen([sys.executable, "-m", "roboloop.cli", "serve", str(models["act"]), "--port", "0",
                          "--precision", "bf16", "--max-batch", "1", "--threads", "1"], stderr=subprocess.PIPE,
                         text=True, env=env)
    try:
        lines = []
        for line in p.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if "listening on" in line or len(lines) > 200:
                break
        start = next(x for x in lines if "chunks of 5x" in x)
        assert f"bf16 ({availability.cpu_bf16()}), at most " in start and " from fp32 (actions up to " in start
    finally:
        p.kill()
        p.wait(30)
