"""Checkpoint sweeps: kept checkpoints become loadable model folders beside the run (the run is only read);
the best is chosen by success, then by the CI's lower bound, then by the later step."""

from __future__ import annotations

import hashlib

import pytest
import torch

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.loop.sweep import Scored, best, offline_scores, plot_sweep, rank_agreement, spearman
from roboloop.training import checkpoint
from roboloop.training.config import TrainConfig
from roboloop.training.kept import export_checkpoint, kept_checkpoints
from roboloop.training.train import train


def test_best_prefers_success_then_ci_low_then_later_step():
    s = [Scored(100, "a", 0.8, 0.6, 0.9, 8, 10), Scored(200, "b", 0.8, 0.65, 0.9, 16, 20),
         Scored(300, "c", 0.7, 0.6, 0.8, 7, 10), Scored(400, "d", 0.8, 0.65, 0.9, 16, 20)]
    assert best(s).step == 400
    assert best(s[:3]).step == 200


def test_spearman_is_scipys_with_fishers_interval():
    from scipy.stats import spearmanr

    x, y = [0.1, 0.4, 0.2, 0.9, 0.5, 0.5], [1.0, 3.0, 2.0, 4.0, 6.0, 5.0]
    rho, lo, hi = spearman(x, y)
    assert rho == pytest.approx(spearmanr(x, y).statistic)
    assert lo is not None and hi is not None and lo < rho < hi <= 1.0
    half = 1.96 * (1.06 / 3) ** 0.5
    assert lo == pytest.approx(__import__("math").tanh(__import__("math").atanh(rho) - half))
    assert spearman([1, 2, 3], [3, 2, 1])[0] == pytest.approx(-1.0) and spearman([1, 2, 3], [3, 2, 1])[1] is None
    assert spearman([1, 1, 1, 1], [1, 2, 3, 4])[0] != spearman([1, 1, 1, 1], [1, 2, 3, 4])[0]  # nan: no ranking


def test_rank_agreement_says_which_offline_score_picks_the_simulators_best():
    success = [0.2, 0.5, 0.8, 0.6, 0.4]  # peaks at step 300, as success often does while the loss keeps falling
    loss = [1.0, 0.6, 0.4, 0.3, 0.2]
    mse = [0.9, 0.5, 0.2, 0.3, 0.6]  # orders the checkpoints as success does
    scored = [Scored(100 * (i + 1), f"m{i}", s, s - 0.1, s + 0.1, int(10 * s), 10,
                     {"train_loss": loss[i], "offline_mse_norm": mse[i]}) for i, s in enumerate(success)]
    a = rank_agreement(scored)
    assert a["best_step"] == 300 and a["checkpoints"] == 5 and "offline_mae_norm" not in a["scores"]
    m, t = a["scores"]["offline_mse_norm"], a["scores"]["train_loss"]
    assert m["spearman"] == 1.0 and m["picks_step"] == 300 and m["regret"] == 0.0
    assert m["ci"] is None and m["p"] == pytest.approx(1 / 120, abs=1e-4)  # 5 points: one ordering in 5! agrees
    assert t["spearman"] == pytest.approx(0.3) and t["picks_step"] == 500 and t["regret"] == pytest.approx(0.4)
    assert t["ci"][0] < 0.3 < t["ci"][1] and 0.2 < t["p"] < 0.5
    flat = rank_agreement([Scored(s.step, s.model, 0.5, 0.4, 0.6, 5, 10, s.offline) for s in scored])
    assert flat["note"] and flat["scores"]["train_loss"]["spearman"] is None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    src = generate_v21(root / "v21", GenSpec(num_episodes=3, min_length=10, max_length=12, cameras={}, seed=1))
    v3 = convert(src, root / "v3", ConvertConfig(progress=False))
    out = root / "run"
    train(TrainConfig(dataset=str(v3), output_dir=str(out), steps=20, checkpoint_every_steps=5, keep_last=2,
                      max_tokens=256, with_video=False, warmup_steps=1, val_fraction=0.34,
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


def test_offline_scores_of_a_checkpoint_are_its_loss_and_its_held_out_error(run, tmp_path):
    import json

    from roboloop.offline import evaluate_offline
    from roboloop.stages import model_ref

    step, ckpt = kept_checkpoints(run)[0]
    dst = export_checkpoint(run, ckpt, step, tmp_path / "step10")
    scores = offline_scores(run, step, model_ref(dst, ""))
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()][:step]
    assert scores["train_loss"] == pytest.approx(sum(losses) / len(losses))
    direct = evaluate_offline(json.loads((run / "config.json").read_text())["train"]["dataset"], dst, stride=4)
    assert scores["offline_mse_norm"] == pytest.approx(direct.mse_norm)
    assert scores["offline_mae_norm"] == pytest.approx(sum(direct.mae_norm) / len(direct.mae_norm))
