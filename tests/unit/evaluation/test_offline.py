"""Offline evaluation: the metric against hand-computed values, and the whole path on a dataset written by
LeRobot's own writer (held-out episodes from the model's recorded split, open-loop plot, paired comparison)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from roboloop.offline import chunk_errors, compare, evaluate_offline
from roboloop.training.config import TrainConfig
from roboloop.training.train import train


def test_chunk_errors_by_hand():
    # two samples, horizon 2, two dims; sample 1's second step is past its episode's end (not counted)
    pred = np.array([[[1.0, 0.0], [2.0, 0.0]], [[0.0, 4.0], [9.0, 9.0]]])
    target = np.array([[[0.0, 0.0], [0.0, 2.0]], [[0.0, 1.0], [0.0, 0.0]]])
    valid = np.array([[True, True], [True, False]])
    e = chunk_errors(pred, target, valid, std=np.array([1.0, 2.0]))
    # dim 0 errors over the 3 valid steps: 1, 2, 0; dim 1: 0, -2, 3
    np.testing.assert_allclose(e["mae"], [1.0, 5 / 3])
    np.testing.assert_allclose(e["rmse"], [np.sqrt(5 / 3), np.sqrt(13 / 3)])
    np.testing.assert_allclose(e["mae_norm"], [1.0, 5 / 6])
    # sample 0: normalised squared errors 1, 0, 4, 1 over 4 values; sample 1: 0, 2.25 over 2 values
    np.testing.assert_allclose(e["per_sample_mse_norm"], [6 / 4, 2.25 / 2])


@pytest.fixture(scope="module")
def lerobot_model(tmp_path_factory):
    from tests.conformance.cases import lerobot_writer

    root = tmp_path_factory.mktemp("offline")
    ds = root / "lerobot_v3"
    lerobot_writer({"observation.images.top": (32, 32)}, {}, ["pick the cube", "place it"], num_episodes=6)(ds)
    out = root / "model"
    train(TrainConfig(dataset=str(ds), output_dir=str(out), steps=4, max_tokens=512, warmup_steps=1,
                      checkpoint_every_steps=0, val_fraction=0.34, seed=2,
                      model_overrides={"image_size": [32, 32], "horizon": 4, "dim": 32, "head_dim_model": 32}))
    return ds, out


def test_offline_scores_exactly_the_held_out_episodes(lerobot_model, tmp_path):
    ds, model = lerobot_model
    split = json.loads((model / "config.json").read_text())["split"]
    assert len(split["validation_episodes"]) == 2 and len(split["train_episodes"]) == 4
    r = evaluate_offline(ds, model, output_dir=tmp_path / "off")
    assert r.episodes == split["validation_episodes"] and r.split == "validation"
    lengths = {e: 9 + 4 * e for e in range(6)}  # what lerobot_writer recorded
    assert r.samples == sum(lengths[e] for e in r.episodes)
    assert r.action_names == [f"j{i}.pos" for i in range(6)] and len(r.mae) == 6
    assert all(np.isfinite(r.mae)) and r.mse_norm > 0
    assert (tmp_path / "off" / "open_loop.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "off" / "offline.json").read_text())
    assert saved["mse_norm"] == r.mse_norm
    again = evaluate_offline(ds, model, stride=3)
    assert again.samples == sum(len(range(0, lengths[e], 3)) for e in r.episodes)


def test_paired_comparison_of_a_model_with_itself_is_exactly_zero(lerobot_model):
    ds, model = lerobot_model
    c = compare(ds, model, model)
    assert c.diff == 0.0 and c.ci_low == 0.0 and c.ci_high == 0.0 and c.not_worse


def test_model_without_a_split_is_refused_with_the_fix(lerobot_model, tmp_path):
    ds, model = lerobot_model
    cfg = json.loads((model / "config.json").read_text())
    other = tmp_path / "nosplit"
    other.mkdir()
    for f in ("model.safetensors", "stats.json"):
        (other / f).write_bytes((model / f).read_bytes())
    cfg["split"] = {"train_episodes": list(range(6)), "validation_episodes": []}
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="val_fraction > 0"):
        evaluate_offline(ds, other)
    assert evaluate_offline(ds, other, episodes="all").samples == sum(9 + 4 * e for e in range(6))


def test_cli_evaluate_offline_prints_one_json_line(lerobot_model, tmp_path, capsys):
    from roboloop.cli import main

    ds, model = lerobot_model
    assert main(["evaluate", "--offline", "--dataset", str(ds), "--policy", str(model), "--stride", "2",
                 "--output-dir", str(tmp_path / "o")]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["split"] == "validation" and len(line["mae_norm"]) == 6 and line["plot"].endswith("open_loop.png")
    assert main(["evaluate", "--offline", "--dataset", str(ds), "--policy", str(model), "--against", str(model)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["diff"] == 0.0


def test_flags_of_the_other_kind_of_evaluation_are_refused(lerobot_model, tmp_path, capsys):
    """Refuse, never ignore: --stride without --offline did nothing, and so did --episodes with it."""
    from roboloop.cli import main

    ds, model = lerobot_model
    assert main(["evaluate", "--policy", str(model), "--stride", "2", "--against", str(model)]) != 0
    assert "--stride, --against apply to evaluate --offline only" in capsys.readouterr().err
    assert main(["evaluate", "--offline", "--dataset", str(ds), "--policy", str(model), "--episodes", "8",
                 "--num-envs", "4"]) != 0
    assert "--episodes, --num-envs apply to a simulator evaluation" in capsys.readouterr().err
