"""The promotion gate for models evaluated offline only (no simulator): paired over held-out episodes."""

from __future__ import annotations

import json
import math
import os

import pytest

from roboloop.binomial import paired_error_gate
from roboloop.registry import CorruptVersionError, Registry


def _model(tmp_path, tag: str):
    d = tmp_path / f"model-{tag}"
    d.mkdir()
    (d / "model.safetensors").write_bytes(os.urandom(64))
    (d / "config.json").write_text(json.dumps({"tag": tag}))
    return d


def _offline(per: dict[int, float], dataset: str = "aa.dir", stride: int = 4, mean_action: float = 1.0) -> dict:
    base = {str(k): mean_action + 0.01 * (k % 3) for k in per}  # the mean-action predictor on the same episodes
    return {"git_commit": "abc", "dataset_md5": dataset, "config": {"x": 1}, "metrics": {"final_loss": 0.1},
            "offline_eval": {"dataset_md5": dataset, "episodes": sorted(per), "stride": stride, "seed": 0,
                             "mse_norm": sum(per.values()) / len(per),
                             "per_episode": {str(k): v for k, v in per.items()},
                             "baselines": {"mean_action": {"mse_norm": sum(base.values()) / len(base),
                                                           "per_episode": base}}}}


def test_paired_error_gate_by_hand():
    """Differences 0.01, 0.02, 0.03 (mean 0.02, sd 0.01): upper bound 0.02 + t(0.95, 2) * 0.01 / sqrt(3)."""
    old = {1: 0.20, 2: 0.30, 3: 0.40}
    new = {1: 0.21, 2: 0.32, 3: 0.43}
    hi = 0.02 + 2.919985580355516 * 0.01 / math.sqrt(3)  # t quantile from tables: 2.920
    ok, reason = paired_error_gate(new, old, margin=0.2)  # bound 0.2 * 0.30 = 0.06 > hi = 0.0369
    assert ok and f"{hi:+.4f}" in reason and "not worse" in reason, reason
    ok, reason = paired_error_gate(new, old, margin=0.1)  # 0.03 < hi: not shown to be within 10%
    assert not ok and "undecided" in reason, reason
    ok, reason = paired_error_gate({1: 0.5, 2: 0.6, 3: 0.7}, old, margin=0.05)
    assert not ok and reason.endswith("worse"), reason
    assert not paired_error_gate({1: 0.1}, {1: 0.2})[0]  # one episode: no interval


def test_offline_versions_are_paired_over_their_held_out_episodes(tmp_path):
    reg = Registry(tmp_path / "reg")
    champ = {3: 0.20, 7: 0.25, 11: 0.30, 15: 0.22}
    assert reg.promote("arm", reg.register("arm", _model(tmp_path, "1"), _offline(champ))).promoted
    better = {k: v * 0.8 for k, v in champ.items()}
    d = reg.promote("arm", reg.register("arm", _model(tmp_path, "2"), _offline(better)), margin=0.05)
    assert d.promoted and d.reason.startswith("offline, paired over 4 held-out episodes"), d.reason
    worse = {k: v * 1.5 for k, v in better.items()}
    d = reg.promote("arm", reg.register("arm", _model(tmp_path, "3"), _offline(worse)))
    assert not d.promoted and reg.resolve("arm", "champion") == 2


def test_a_first_offline_version_must_beat_the_trivial_predictors(tmp_path):
    """The G1 case: a first model worse than predicting the mean action (mse_norm 1.57 vs ~1.0) is registered and
    not promoted; one clearly better on every held-out episode becomes champion."""
    reg = Registry(tmp_path / "reg")
    bad = {3: 1.5, 7: 1.6, 11: 1.62, 15: 1.55}
    d = reg.promote("arm", reg.register("arm", _model(tmp_path, "1"), _offline(bad)))
    assert not d.promoted and d.reason.startswith("first version vs mean_action baseline (mse_norm 1.0"), d.reason
    assert "not promoted" in d.reason and reg.aliases("arm")[0].get("champion") is None
    good = {3: 0.3, 7: 0.25, 11: 0.4, 15: 0.35}
    d = reg.promote("arm", reg.register("arm", _model(tmp_path, "2"), _offline(good)))
    assert d.promoted and "better than the baseline: champion" in d.reason, d.reason
    no_base = _offline(good)
    del no_base["offline_eval"]["baselines"]
    reg2 = Registry(tmp_path / "reg2")
    assert not reg2.promote("arm", reg2.register("arm", _model(tmp_path, "3"), no_base)).promoted


def test_a_champion_scored_elsewhere_is_rescored_on_the_challengers_episodes(tmp_path):
    """New data version: the champion's held-out episodes are not the challenger's. Without a way to rescore it
    the gate refuses to promote; with one, the champion is scored once on the challenger's episodes."""
    reg = Registry(tmp_path / "reg")
    assert reg.promote("arm", reg.register("arm", _model(tmp_path, "1"), _offline({0: 0.3, 1: 0.3}, "old.dir"))
                       ).promoted
    new = {4: 0.10, 5: 0.12, 6: 0.11}
    v2 = reg.register("arm", _model(tmp_path, "2"), _offline(new, "new.dir"))
    d = reg.promote("arm", v2)
    assert not d.promoted and d.reason.startswith("not comparable"), d.reason
    calls = []

    def rescore(champion: int, off: dict) -> dict:
        calls.append((champion, tuple(off["episodes"])))
        return {**off, "per_episode": {"4": 0.2, "5": 0.21, "6": 0.19}}

    d = reg.promote("arm", v2, rescore=rescore)
    assert d.promoted and calls == [(1, (4, 5, 6))], (d.reason, calls)


def test_a_simulator_champion_and_an_offline_challenger_are_not_compared_blindly(tmp_path):
    reg = Registry(tmp_path / "reg")
    sim = {"git_commit": "abc", "dataset_md5": "a.dir", "config": {"x": 1}, "metrics": {"l": 1},
           "eval": {"successes": 9, "episodes": 10}, "baseline_eval": {"successes": 0, "episodes": 10}}
    reg.promote("arm", reg.register("arm", _model(tmp_path, "1"), sim))
    d = reg.promote("arm", reg.register("arm", _model(tmp_path, "2"), _offline({0: 0.1, 1: 0.2})))
    assert not d.promoted and "not comparable" in d.reason


def test_inconsistent_offline_scores_are_refused(tmp_path):
    reg = Registry(tmp_path / "reg")
    bad = _offline({0: 0.1, 1: 0.2})
    bad["offline_eval"]["per_episode"]["1"] = float("nan")
    with pytest.raises(CorruptVersionError, match="offline_eval is inconsistent"):
        reg.promote("arm", reg.register("arm", _model(tmp_path, "1"), bad))
