"""Checkpoint sweeps: kept checkpoints become loadable model folders beside the run (the run is only read);
the best is chosen by success, then by the CI's lower bound, then by the later step."""

from __future__ import annotations

import hashlib

import pytest
import torch

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.evaluation.sweep import Scored, best, export_checkpoint, kept_checkpoints, plot_sweep
from roboloop.training import checkpoint
from roboloop.training.config import TrainConfig
from roboloop.training.train import train


def test_best_prefers_success_then_ci_low_then_later_step():
    s = [Scored(100, "a", 0.8, 0.6, 0.9, 8, 10), Scored(200, "b", 0.8, 0.65, 0.9, 16, 20),
         Scored(300, "c", 0.7, 0.6, 0.8, 7, 10), Scored(400, "d", 0.8, 0.65, 0.9, 16, 20)]
    assert best(s).step == 400
    assert best(s[:3]).step == 200


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    src = generate_v21(root / "v21", GenSpec(num_episodes=3, min_length=10, max_length=12, cameras={}, seed=1))
    v3 = convert(src, root / "v3", ConvertConfig(progress=False))
    out = root / "run"
    train(TrainConfig(dataset=str(v3), output_dir=str(out), steps=20, checkpoint_every_steps=5, keep_last=2,
                      max_tokens=256, with_video=False, warmup_steps=1,
                      model_overrides={"horizon": 4, "dim": 32, "head_dim_model": 32}))
    return out


def _tree_hash(root) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def test_kept_checkpoints_export_as_loadable_models_without_touching_the_run(run, tmp_path):
    from safetensors.torch import load_file

    from roboloop.policies.vla import ModelPolicy

    before = _tree_hash(run)
    kept = kept_checkpoints(run)
    assert [s for s, _ in kept] == [10, 15]  # keep_last 2; the final step is the model itself
    step, ckpt = kept[0]
    dst = export_checkpoint(run, ckpt, step, tmp_path / "step10")
    state = checkpoint.load(ckpt)["model"]
    w = load_file(dst / "model.safetensors")
    assert set(w) == set(state) and all(torch.equal(w[k], state[k]) for k in w)
    assert ModelPolicy(dst).cfg.horizon == 4
    assert _tree_hash(run) == before
    assert export_checkpoint(run, ckpt, step, dst) == dst  # the same step again: reused
    png = plot_sweep([Scored(10, str(dst), 0.5, 0.3, 0.7, 5, 10), Scored(15, "x", 0.6, 0.4, 0.8, 6, 10)],
                     tmp_path / "sweep.png")
    assert png.stat().st_size > 1000
