"""The Evaluator's bookkeeping on a scripted env with known outcomes; Wilson interval; gate statistics."""

from __future__ import annotations

import json

import pytest
import torch

from roboloop.binomial import non_inferior, wilson
from roboloop.evaluation.evaluator import evaluate
from roboloop.evaluation.policies import RandomPolicy
from roboloop.sim.protocol import ScriptedEnv


class CountingPolicy:
    name = "counting"

    def __init__(self, horizon: int):
        self.h, self.calls, self.rows = horizon, 0, 0

    def act(self, obs):
        self.calls += 1
        self.rows += obs.state.shape[0]
        return torch.zeros(obs.state.shape[0], self.h, 1)


def test_counts_exactly_n_episodes_without_short_episode_bias():
    # env 0: short successful episodes; env 1: long failures; env 2: alternating
    env = ScriptedEnv(lengths=[[3], [11], [5, 7]], outcomes=[[True], [False], [True, False]])
    report, _ = evaluate(env, CountingPolicy(4), episodes=7, execute_steps=2, videos=0)
    assert report.episodes == 7 == len(report.per_episode)
    # counted = the first 7 episodes to *start*: env0 starts eps at t=0,3,6,9,...; env1 at 0,11; env2 at 0,5,12
    starts = sorted([(t, 0) for t in range(0, 30, 3)] + [(t, 1) for t in (0, 11, 22)] + [(t, 2) for t in (0, 5, 12)])
    first7 = starts[:7]
    expect_success = sum(1 for t, e in first7 if e == 0) + sum(1 for t, e in first7 if e == 2 and t in (0, 12))
    assert report.successes == expect_success
    assert sum(e["env"] == 1 for e in report.per_episode) == sum(e == 1 for _, e in first7)


def test_runs_to_n_even_with_more_envs_than_episodes():
    env = ScriptedEnv(lengths=[[4]] * 8, outcomes=[[True], [False]] * 4)
    report, _ = evaluate(env, CountingPolicy(1), episodes=3, execute_steps=1, videos=0)
    assert report.episodes == 3 and {e["env"] for e in report.per_episode} == {0, 1, 2}
    assert report.successes == 2


def test_action_chunks_replan_every_k_steps_and_after_reset():
    env = ScriptedEnv(lengths=[[10]], outcomes=[[True]])
    pol = CountingPolicy(horizon=8)
    evaluate(env, pol, episodes=2, execute_steps=4, videos=0)
    assert pol.calls == 6  # 10-step episodes: plans at t=0,4,8 in each


def test_report_files_and_rollout_trajectories(tmp_path):
    env = ScriptedEnv(lengths=[[6], [8]], outcomes=[[True], [False]])
    report, trajs = evaluate(env, RandomPolicy(env), episodes=4, execute_steps=1, videos=2, output_dir=tmp_path,
                             record_rollouts=True)
    assert len(trajs) == 4 and all(len(t["states"]) == len(t["actions"]) for t in trajs)
    assert sorted(len(t["states"]) for t in trajs) == [6, 6, 8, 8]
    assert len(report.videos) == 2 and (tmp_path / "eval.png").exists()
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["success_rate"] == 0.5 and saved["ci_low"] < 0.5 < saved["ci_high"]


def test_wilson_interval():
    lo, hi = wilson(48, 48)
    assert hi == pytest.approx(1.0) and lo == pytest.approx(0.9259, abs=1e-4)
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)


def test_non_inferiority():
    assert non_inferior(90, 100, 80, 100, margin=0.05)[0]
    assert not non_inferior(50, 100, 80, 100, margin=0.05)[0]
    assert not non_inferior(79, 100, 80, 100, margin=0.0)[0]  # equal-ish without margin is not enough


def test_episodes_are_numbered_in_start_order():
    env = ScriptedEnv(lengths=[[3], [11], [5, 7]], outcomes=[[True], [False], [True, False]])
    report, _ = evaluate(env, CountingPolicy(4), episodes=7, execute_steps=2, videos=0)
    starts = sorted([(t, 0) for t in range(0, 30, 3)] + [(t, 1) for t in (0, 11, 22)] + [(t, 2) for t in (0, 5, 12)])
    by_number = {e["index"]: e["env"] for e in report.per_episode}
    assert sorted(by_number) == list(range(7))
    # same-step starts are numbered in env order, as the envs reset them
    assert [by_number[k] for k in range(7)] == [e for _, e in starts[:7]]


def test_paired_difference_by_hand():
    from roboloop.binomial import paired_difference

    champ = {k: True for k in range(10)}
    chall = {**champ, 3: False}  # one discordant pair: d = [0]*9 + [-1]
    r = paired_difference(chall, champ, margin=0.05)
    sd = (((0 + 0.1) ** 2 * 9 + (-1 + 0.1) ** 2) / 9) ** 0.5
    assert r["diff"] == pytest.approx(-0.1) and r["discordant"] == 1
    assert r["ci_low"] == pytest.approx(-0.1 - 1.959963984540054 * sd / 10 ** 0.5)
    assert r["decision"] == "undecided" and r["episodes_needed"] > 10
    same = paired_difference(champ, champ)  # 10 identical outcomes do not show "not worse by 0.05"
    assert same["decision"] == "undecided" and same["diff"] == 0.0
    # ... 100 do: the spread is floored as if one pair were discordant: half-width 1.96 * sqrt(0.01 / 100)
    many = paired_difference({k: True for k in range(100)}, {k: True for k in range(100)})
    assert many["decision"] == "not_worse" and many["ci_low"] == pytest.approx(-1.959963984540054 * 0.01)
    worse = paired_difference({k: False for k in range(40)}, {k: True for k in range(40)})
    assert worse["decision"] == "worse"
    with pytest.raises(ValueError, match="no episode in common"):
        paired_difference({1: True}, {2: True})


def test_pooled_paired_difference_clusters_pairs_that_share_episodes():
    from roboloop.binomial import paired_difference, pooled_paired_difference

    ch = {k: k % 3 != 0 for k in range(30)}
    cp = {k: k % 5 != 0 for k in range(30)}
    one = paired_difference(ch, cp)
    pooled = pooled_paired_difference([(ch, cp, "a")])
    assert pooled["diff"] == pytest.approx(one["diff"]) and pooled["clusters"] == 30
    assert (pooled["ci_low"], pooled["ci_high"]) == pytest.approx((one["ci_low"], one["ci_high"]))
    # the same outcomes twice on the same episodes (two seeds that agree) are no new evidence...
    twice = pooled_paired_difference([(ch, cp, "a"), (ch, cp, "a")])
    assert twice["episodes"] == 60 and twice["clusters"] == 30
    assert (twice["ci_low"], twice["ci_high"]) == pytest.approx((one["ci_low"], one["ci_high"]))
    # ... while the same outcomes on other episodes (another task or seed) are: the interval narrows by ~sqrt 2
    apart = pooled_paired_difference([(ch, cp, "a"), (ch, cp, "b")])
    assert apart["clusters"] == 60
    ratio = (apart["ci_high"] - apart["ci_low"]) / (one["ci_high"] - one["ci_low"])
    assert ratio == pytest.approx((29 / 30 * 60 / 59 / 2) ** 0.5, rel=1e-6)  # G/(G-1): 30/29, then 60/59
    with pytest.raises(ValueError, match="pair 2"):
        pooled_paired_difference([(ch, cp, "a"), ({1: True}, {2: True}, "a")])


def test_cli_compare_pairs_two_runs_by_episode_number(tmp_path, capsys):
    from roboloop.cli import main

    for name, outcomes in (("a", [[True], [True]]), ("b", [[True], [False]])):
        env = ScriptedEnv(lengths=[[3], [3]], outcomes=outcomes)
        evaluate(env, CountingPolicy(1), episodes=20, execute_steps=1, videos=0, output_dir=tmp_path / name)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--margin", "0.05"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["episodes"] == 20 and out["diff"] == pytest.approx(0.5) and out["decision"] == "not_worse"
    # two pairs: each pair's line, then the pooled one (here the same runs twice: same episodes, one cluster each)
    assert main(["compare", *(str(tmp_path / n) for n in "abab")]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert len(lines) == 3 and lines[2]["pooled"] and lines[2]["pairs"] == 2 and lines[2]["clusters"] == 20
    assert lines[2]["diff"] == pytest.approx(0.5) and lines[2]["ci_low"] == pytest.approx(out["ci_low"])
    with pytest.raises(SystemExit, match="in pairs"):
        main(["compare", *(str(tmp_path / n) for n in "aba")])


def test_early_decision_spends_alpha_over_the_looks():
    from statistics import NormalDist

    from roboloop.binomial import early_decision

    ref = "1" * 96  # 6 looks of 16: each at alpha / 6
    z = NormalDist().inv_cdf(1 - 0.05 / 6)
    assert early_decision([True] * 16, ref, 96, 16) is None  # half-width z / 16 = 0.149: undecided
    assert early_decision([True] * 32, ref, 96, 16) is None  # z / 32 = 0.075
    assert z / 48 < 0.05
    why = early_decision([True] * 48, ref, 96, 16)
    assert why and why.startswith("stopped after 48 of 96 episodes") and "not worse" in why, why
    assert "worse" in early_decision([False] * 16, ref, 96, 16)  # all lost: worse at the first look


def test_evaluation_stops_at_a_look_and_counts_exactly_the_prefix():
    """Envs finish out of order; the stop sees episodes 0..k-1 only when all of them finished, and the report
    counts exactly those (later-started episodes are dropped whatever their outcome)."""
    env = ScriptedEnv(lengths=[[3], [7], [5, 2]], outcomes=[[False], [False], [False, True]])
    seen = []

    def stop(outcomes):
        seen.append(len(outcomes))
        return "decided" if len(outcomes) >= 32 else None

    report, _ = evaluate(env, CountingPolicy(1), episodes=96, execute_steps=1, videos=0, stop=stop, look_every=16)
    assert seen == [16, 32] and report.episodes == 32 and report.stopped_early == "decided"
    assert sorted(e["index"] for e in report.per_episode) == list(range(32)) and report.planned_episodes == 96
    assert report.success_rate == report.successes / 32


class HistoryPolicy:
    """Reads three frames; records what the Evaluator handed it."""

    name, history = "history", 3

    def __init__(self):
        self.seen: list[tuple[torch.Tensor, list[torch.Tensor]]] = []

    def act(self, obs):
        self.seen.append((obs.state.clone(), [p.state.clone() for p in obs.past]))
        return torch.zeros(obs.state.shape[0], 2, 1)


def test_a_history_policy_gets_its_previous_frames_never_another_episodes():
    env = ScriptedEnv(lengths=[[5], [3, 7]], outcomes=[[True], [False]])
    pol = HistoryPolicy()
    evaluate(env, pol, episodes=6, execute_steps=2, videos=0)
    assert pol.seen
    for now, past in pol.seen:
        assert len(past) == 2
        t, k = now[:, 0], now[:, 1]
        for j, p in enumerate(past):  # oldest first; an episode's first frame repeated before it
            assert torch.equal(p[:, 0], (t - (2 - j)).clamp(min=0)), (now, past)
            assert torch.equal(p[:, 1], k)  # the same episode
