"""The gate's robustness and latency checks: a challenger better on the nominal episodes but worse under one
perturbation (or at its measured p99 latency) is refused, and the reason names the check that decided."""

from __future__ import annotations

from roboloop.registry import Registry
from tests.unit.registry.test_registry import _model, _paired

CHAMP = "1" * 40 + "0" * 20  # 40/60 nominal
BETTER = "1" * 54 + "0" * 6  # 54/60 nominal: better on the same episodes


def _with(outcomes: str, perturbed: dict[str, str], p99: str | None = None, ms: float = 20.0, **gate) -> dict:
    lin = _paired(outcomes)
    lin["eval"]["perturbations"] = {f: {lv: {"success_rate": o.count("1") / len(o), "outcomes": o}}
                                    for f, (lv, o) in perturbed.items()}
    if p99 is not None:
        lin["eval"]["latency"] = [{"setting": "measured p99", "ms": ms, "delay_steps": 1,
                                   "success_rate": p99.count("1") / len(p99), "outcomes": p99}]
    if gate:
        lin["eval"]["gate"] = gate
    return lin


def test_better_nominally_but_worse_under_a_factor_is_refused_by_the_robustness_check(tmp_path):
    reg = Registry(tmp_path / "registry")
    champ = _with(CHAMP, {"frame_drop": ("0.5", CHAMP), "obs_noise": ("0.02", CHAMP)}, p99=CHAMP)
    assert reg.promote("reach", reg.register("reach", _model(tmp_path, "1"), champ)).promoted
    fragile = {"frame_drop": ("0.5", "1" * 10 + "0" * 50), "obs_noise": ("0.02", BETTER)}  # 10/60 with drops
    # without the check the nominal episodes decide: promoted
    plain = reg.register("reach", _model(tmp_path, "2"), _with(BETTER, fragile))
    d = reg.promote("reach", plain, margin=0.05)
    assert d.promoted, d.reason
    reg.promote("reach", 1, force=True)  # back to the robust champion
    checked = reg.register("reach", _model(tmp_path, "3"), _with(BETTER, fragile, gate_robustness=0.1))
    d = reg.promote("reach", checked, margin=0.05)
    assert not d.promoted and "robustness frame_drop=0.5 (margin 0.1)" in d.reason, d.reason
    assert d.reason.endswith("decided by robustness: not promoted") and d.reason.startswith("nominal: paired")
    robust = {"frame_drop": ("0.5", CHAMP), "obs_noise": ("0.02", BETTER)}
    d = reg.promote("reach", reg.register("reach", _model(tmp_path, "4"), _with(BETTER, robust, gate_robustness=0.1)))
    assert d.promoted and "not worse under 2 perturbation(s)" in d.reason, d.reason


def test_a_slower_challenger_that_loses_success_at_its_p99_is_refused_by_the_latency_check(tmp_path):
    reg = Registry(tmp_path / "registry")
    assert reg.promote("reach", reg.register("reach", _model(tmp_path, "1"), _with(CHAMP, {}, p99=CHAMP))).promoted
    slow = _with(BETTER, {}, p99="1" * 20 + "0" * 40, ms=180.0, gate_latency=True)
    d = reg.promote("reach", reg.register("reach", _model(tmp_path, "2"), slow))
    assert not d.promoted and "latency at each one's measured p99 (180 vs 20 ms)" in d.reason, d.reason
    assert d.reason.endswith("decided by latency: not promoted")
    # a champion evaluated before latency was measured: the check is named as not made, not passed in silence
    reg2 = Registry(tmp_path / "registry2")
    assert reg2.promote("reach", reg2.register("reach", _model(tmp_path, "5"), _paired(CHAMP))).promoted
    d = reg2.promote("reach", reg2.register("reach", _model(tmp_path, "6"), slow))
    assert d.promoted and "latency not checked: the champion was not evaluated at its measured p99" in d.reason


def test_the_lineage_keeps_what_the_checks_read_and_a_check_without_its_evaluation_is_refused():
    import pytest

    from roboloop.evaluation.config import EvalRecipe
    from roboloop.lineage import eval_record
    from roboloop.receipts import EvalSummary

    s = EvalSummary(run_dir="/r", report_sha256="0" * 64, policy="m", policy_id="w", task="t", episodes=4,
                    successes=3, success_rate=0.75, ci_low=0.3, ci_high=0.95, outcomes="1101",
                    perturbations={"frame_drop": {"0.5": {"success_rate": 0.5, "ci_low": 0.1, "ci_high": 0.9,
                                                          "episodes": 4, "drop": 0.25, "outcomes": "1001"}}},
                    latency=[{"setting": "measured p99", "ms": 31.0, "delay_steps": 1, "success_rate": 0.25,
                              "ci_low": 0.0, "ci_high": 0.7, "episodes": 4, "drop": 0.5, "outcomes": "0001"}])
    ev = eval_record(s)
    assert ev["perturbations"] == {"frame_drop": {"0.5": {"success_rate": 0.5, "outcomes": "1001"}}}
    assert ev["latency"][0]["outcomes"] == "0001" and ev["latency"][0]["ms"] == 31.0
    # a run that could stop early keeps its looks: the gate's test of it spends alpha / looks
    s.perturbations["frame_drop"]["0.5"]["looks"], s.latency[0]["looks"] = 3, 2
    ev = eval_record(s)
    assert ev["perturbations"]["frame_drop"]["0.5"]["looks"] == 3 and ev["latency"][0]["looks"] == 2
    with pytest.raises(ValueError, match="gate_robustness would do nothing: no perturbation is evaluated"):
        EvalRecipe(gate_robustness=0.1)
    with pytest.raises(ValueError, match="gate_latency would do nothing"):
        EvalRecipe(gate_latency=True, latency="50")
    assert EvalRecipe(perturb="frame_drop", gate_robustness=0.1, latency="measured", gate_latency=True).gate_latency


def test_the_gate_pairs_only_evaluations_of_the_same_initial_states(tmp_path):
    """Same task, seed and execution but other initial states (a changed scene draws other layouts for the same
    seed): the outcomes are not of the same episodes, so the gate compares them unpaired, and says so."""
    reg = Registry(tmp_path / "registry")
    champ = _paired(CHAMP)
    champ["eval"]["initial_states"] = "a" * 64
    assert reg.promote("reach", reg.register("reach", _model(tmp_path, "1"), champ)).promoted
    same = _paired(BETTER)
    same["eval"]["initial_states"] = "a" * 64
    d = reg.promote("reach", reg.register("reach", _model(tmp_path, "2"), same))
    assert d.promoted and d.reason.startswith("paired"), d.reason
    other = _paired(BETTER)
    other["eval"]["initial_states"] = "b" * 64
    d = reg.promote("reach", reg.register("reach", _model(tmp_path, "3"), other))
    assert d.reason.startswith("unpaired (not the same episodes)"), d.reason


def test_a_baseline_of_the_first_episodes_pairs_with_the_policys():
    from roboloop.registry import same_episodes

    keys = ("task", "seed")
    policy, baseline = {"task": "t", "seed": 0, "initial_states": "1234abcd" * 3}, {"task": "t", "seed": 0}
    assert same_episodes(policy, {**baseline, "initial_states": "1234abcd"}, keys)  # its first episode: the same
    assert not same_episodes(policy, {**baseline, "initial_states": "ffffffff"}, keys)
    assert same_episodes(policy, baseline, keys)  # a record from before the hash: task and seed decide


def test_a_perturbation_run_that_looked_before_its_end_is_tested_at_alpha_over_its_looks(tmp_path):
    """A cell whose run stopped early against the champion's (or could have: `looks` planned tests) spends alpha /
    looks in the gate's test, as each look did: 3 of the champion's 40 successes lost under the factor pass at
    alpha 0.05 and fail at 0.05 / 3."""
    reg = Registry(tmp_path / "registry")
    champ = _with(CHAMP, {"obs_noise": ("0.02", CHAMP)})
    assert reg.promote("reach", reg.register("reach", _model(tmp_path, "1"), champ)).promoted
    lost3 = "0" * 3 + CHAMP[3:]
    once = reg.register("reach", _model(tmp_path, "2"), _with(BETTER, {"obs_noise": ("0.02", lost3)},
                                                                gate_robustness=0.1))
    assert reg.promote("reach", once, margin=0.05).promoted  # the nominal run did not look
    reg.promote("reach", 1, force=True)
    nominal_looked = _with(BETTER, {"obs_noise": ("0.02", lost3)}, gate_robustness=0.1)
    nominal_looked["eval"]["looks"] = 3  # its own looks: they do not spend the cell's alpha again
    d = reg.promote("reach", reg.register("reach", _model(tmp_path, "2b"), nominal_looked), margin=0.05)
    assert d.promoted and "alpha 0.05/3: its evaluation looked 2 times" in d.reason, d.reason
    reg.promote("reach", 1, force=True)
    looked = _with(BETTER, {"obs_noise": ("0.02", lost3)}, gate_robustness=0.1)
    looked["eval"]["perturbations"]["obs_noise"]["0.02"]["looks"] = 3
    d = reg.promote("reach", reg.register("reach", _model(tmp_path, "3"), looked), margin=0.1)
    assert not d.promoted and "robustness obs_noise=0.02 (margin 0.1, alpha 0.05/3: its run looked 2 times" \
        in d.reason, d.reason


def test_the_run_at_the_p99_latency_that_looked_is_tested_at_alpha_over_its_looks_and_the_nominal_looks_are_its_own(
        tmp_path):
    """3 of the champion's 40 successes lost at the p99 latency pass the latency check (margin 0.1) at alpha 0.05
    and fail at 0.05 / 3 when that run looked (it could stop early against the champion's); the nominal run's own
    looks do not spend the latency run's alpha again."""
    reg = Registry(tmp_path / "registry")
    assert reg.promote("reach", reg.register("reach", _model(tmp_path, "1"), _with(CHAMP, {}, p99=CHAMP))).promoted
    lost3 = "0" * 3 + CHAMP[3:]
    nominal_looked = _with(BETTER, {}, p99=lost3, gate_latency=True)
    nominal_looked["eval"]["looks"] = 3
    d = reg.promote("reach", reg.register("reach", _model(tmp_path, "2"), nominal_looked), margin=0.1)
    assert d.promoted and "alpha 0.05/3: its evaluation looked 2 times" in d.reason, d.reason
    reg.promote("reach", 1, force=True)
    looked = _with(BETTER, {}, p99=lost3, gate_latency=True)
    looked["eval"]["latency"][0]["looks"] = 3
    d = reg.promote("reach", reg.register("reach", _model(tmp_path, "3"), looked), margin=0.1)
    assert not d.promoted and "(20 vs 20 ms, alpha 0.05/3: its run looked 2 times before its end)" in d.reason, \
        d.reason


def test_a_challenger_the_robots_envelope_refuses_more_often_is_not_promoted(tmp_path):
    """gate_envelope: better on the nominal episodes, but the robot's envelope refused its actions more often per
    step than the champion's (what a robot would hold): not promoted, the envelope named as the decider."""
    import pytest

    from roboloop.evaluation.config import EvalRecipe

    def with_envelope(outcomes: str, refused: int, steps: int = 9600, **gate) -> dict:
        lin = _with(outcomes, {}, **gate)
        lin["eval"]["envelope"] = {"refused": refused, "clamped": 0, "steps": steps}
        return lin

    reg = Registry(tmp_path / "registry")
    assert reg.promote("reach", reg.register("reach", _model(tmp_path, "1"), with_envelope(CHAMP, 0))).promoted
    jumpy = with_envelope(BETTER, 834, gate_envelope=True)
    d = reg.promote("reach", reg.register("reach", _model(tmp_path, "2"), jumpy))
    assert not d.promoted and d.reason.endswith("decided by the envelope: not promoted"), d.reason
    assert "the challenger refused 834 of 9600 steps, the champion 0 of 9600 (more often per step)" in d.reason
    calm = with_envelope(BETTER, 0, steps=9000, gate_envelope=True)
    d = reg.promote("reach", reg.register("reach", _model(tmp_path, "3"), calm))
    assert d.promoted and "(no more often per step)" in d.reason, d.reason
    unmeasured = _with(BETTER, {}, gate_envelope=True)  # asked for the check, evaluated without the envelope
    d = reg.promote("reach", reg.register("reach", _model(tmp_path, "4"), unmeasured))
    assert not d.promoted and "was not evaluated through the robot's envelope" in d.reason
    with pytest.raises(ValueError, match="gate_envelope would do nothing"):
        EvalRecipe(gate_envelope=True)
    assert EvalRecipe(envelope="robot", gate_envelope=True).gate_envelope
