"""Early stopping against the champion on the real reach task: the evaluation ends at the first look where
the paired decision is certain, and the summary says so."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.isaac
REACH = {"task": "Roboloop-Reach-Color-v0", "seed": 0, "execute_steps": 4, "episodes": 48, "successes": 0}


def _champions(tmp_path, monkeypatch, evals: dict[str, dict]):
    """A registry whose champions (set by hand: 0/48 beats no baseline) carry these evaluation records."""
    from roboloop.registry import Registry

    monkeypatch.setenv("ROBOLOOP_ARTIFACTS", str(tmp_path / "artifacts"))
    reg = Registry(tmp_path / "registry")
    weak = tmp_path / "weak"
    weak.mkdir()
    (weak / "model.safetensors").write_bytes(b"weights")
    (weak / "config.json").write_text(json.dumps({}))
    for name, ev in evals.items():
        lineage = {"git_commit": "abc", "dataset_md5": "x.dir", "config": {"a": 1}, "metrics": {"final_loss": 1.0},
                   "eval": ev}
        reg.promote(name, reg.register(name, weak, lineage), force=True)
    return reg


def test_evaluation_stops_once_the_paired_decision_is_certain(tmp_path, monkeypatch):
    from roboloop import stages
    from roboloop.evaluation.config import EvalRecipe
    from roboloop.lineage import eval_record

    # a champion that failed the first 48 test-split episodes of this task, seed and execution
    reg = _champions(tmp_path, monkeypatch, {"reach": {**REACH, "outcomes": "0" * 48}})
    recipe = EvalRecipe(episodes=48, num_envs=16, execute_steps=4, videos=0, early_stop=True)
    s = stages.evaluate("expert", recipe, against="reach", registry=str(reg.uri), on_line=lambda _l: None)
    assert s.episodes == 16 and s.planned_episodes == 48 and s.successes == 16, s
    assert s.stopped_early and s.stopped_early.startswith("stopped after 16 of 48 episodes"), s.stopped_early
    assert s.outcomes == "1" * 16
    # three planned tests (episodes 16, 32 and the gate's on all 48), each at alpha / 3: the gate spends the same
    assert s.looks == 3 and eval_record(s)["looks"] == 3
    # without a comparable champion (another seed) it runs them all
    full = stages.evaluate("expert", recipe.model_copy(update={"seed": 1}), against="reach", registry=str(reg.uri),
                           on_line=lambda _l: None)
    assert full.episodes == 48 and full.stopped_early is None and full.looks is None


def test_each_perturbation_run_stops_against_the_champions_and_the_suites_play_the_nominal_episodes(tmp_path,
                                                                                                 monkeypatch):
    """With `gate_robustness` (the gate checks each perturbation's run), a perturbed run stops at the first look
    where its paired decision against the champion's run under the same factor is certain; and after a nominal run
    that stopped early, the suites play only the episodes it played (the only ones that pair with it)."""
    from roboloop import stages
    from roboloop.evaluation.config import EvalRecipe
    from roboloop.lineage import eval_record

    failed = {"obs_noise": {"0.02": {"success_rate": 0.0, "outcomes": "0" * 48}}}
    reg = _champions(tmp_path, monkeypatch, {"perturbed-only": {**REACH, "perturbations": failed},  # no nominal
                                             "nominal-only": {**REACH, "outcomes": "0" * 48}})
    recipe = EvalRecipe(episodes=48, num_envs=16, execute_steps=4, videos=0, early_stop=True, perturb="obs_noise=0.02",
                        gate_robustness=0.1)
    s = stages.evaluate("expert", recipe, against="perturbed-only", registry=str(reg.uri), on_line=lambda _l: None)
    cell = s.perturbations["obs_noise"]["0.02"]
    assert s.episodes == 48 and s.stopped_early is None, s  # the nominal run had nothing to stop against
    assert cell["episodes"] == 16 and cell["looks"] == 3 and cell["success_rate"] == 1.0, cell
    assert cell["stopped_early"].startswith("stopped after 16 of 48 episodes: paired with the champion, not worse")
    assert eval_record(s)["perturbations"]["obs_noise"]["0.02"]["looks"] == 3  # the gate's test spends alpha / 3
    # a robustness margin the gate does not check: nothing to stop for, every episode played
    full = stages.evaluate("expert", recipe.model_copy(update={"gate_robustness": None}), against="perturbed-only",
                           registry=str(reg.uri), on_line=lambda _l: None)
    assert full.perturbations["obs_noise"]["0.02"]["episodes"] == 48
    assert "stopped_early" not in full.perturbations["obs_noise"]["0.02"]
    short = stages.evaluate("expert", recipe, against="nominal-only", registry=str(reg.uri), on_line=lambda _l: None)
    assert short.episodes == 16 and short.stopped_early, short
    assert short.perturbations["obs_noise"]["0.02"]["episodes"] == 16  # the suite played what the nominal run did


def test_the_run_at_the_measured_p99_latency_stops_against_the_champions(tmp_path, monkeypatch):
    """With `gate_latency` (the gate pairs the runs at each one's measured p99 latency), that run stops at the first
    look where its paired decision against the champion's run at its own p99 is certain; the p50 run, which no
    check reads, plays every episode."""
    from roboloop import stages
    from roboloop.evaluation.config import EvalRecipe
    from roboloop.lineage import eval_record

    p99 = [{"setting": "measured p99", "ms": 40.0, "delay_steps": 1, "success_rate": 0.0, "outcomes": "0" * 48}]
    reg = _champions(tmp_path, monkeypatch, {"slow": {**REACH, "latency": p99}})  # no nominal outcomes
    recipe = EvalRecipe(episodes=48, num_envs=16, execute_steps=4, videos=0, early_stop=True, latency="measured",
                        gate_latency=True)
    s = stages.evaluate("expert", recipe, against="slow", registry=str(reg.uri), on_line=lambda _l: None)
    rows = {r["setting"]: r for r in s.latency}
    assert s.episodes == 48 and rows["measured p50"]["episodes"] == 48 and "looks" not in rows["measured p50"]
    assert rows["measured p99"]["episodes"] == 16 and rows["measured p99"]["looks"] == 3, rows
    assert rows["measured p99"]["stopped_early"].startswith("stopped after 16 of 48 episodes: paired with the "
                                                            "champion, not worse"), rows
    assert next(r for r in eval_record(s)["latency"] if r["setting"] == "measured p99")["looks"] == 3
