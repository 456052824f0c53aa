"""The promotion gate's robustness check on two models trained here, on the real reach task: the same recipe, one
trained on demonstrations that also include scenes laid out past the training range (`collect --perturb
object_pose=1`, aggregated with the nominal ones), one on the nominal ones alone. On the nominal episodes the second
is not worse, and the nominal gate promotes it over the first; with the ball placed where it never was in its
demonstrations it fails where the first does not, and with `gate_robustness` the gate refuses it and says that
robustness decided."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.isaac

TASK, DEMOS, STEPS = "Roboloop-Reach-Red-v0", 128, 120  # at 400 steps: the same verdicts in 300 s, not 172
FACTOR = "object_pose=1"


def _trained(tmp_path, with_factor: bool):
    """The demo recipe on `DEMOS` nominal demonstrations (and as many under `FACTOR`, with_factor)."""
    from roboloop import stages
    from roboloop.datasets.config import ConvertConfig
    from roboloop.loop import presets

    quiet = lambda _line: None  # noqa: E731
    demo = presets.demo()
    collect = demo.collect_if_missing.model_copy(  # type: ignore[union-attr]
        update={"task": TASK, "episodes": DEMOS, "num_envs": 32, "instructions_per_layout": 1})
    raw = stages.ingest(str(tmp_path / "nominal"), collect=collect, on_line=quiet)
    if with_factor:
        moved = stages.ingest(str(tmp_path / "moved"), collect=collect.model_copy(update={"perturb": FACTOR}),
                              on_line=quiet)
        raw = stages.aggregate([raw, moved])
    data = stages.convert(raw, ConvertConfig(progress=False))
    recipe = demo.train.model_copy(update={"steps": STEPS, "checkpoint_every_steps": 0})
    return raw, data, stages.train(data, recipe, on_line=quiet)


def test_the_gate_refuses_a_challenger_trained_without_the_perturbation_the_champion_was_trained_with(
        tmp_path, monkeypatch):
    from roboloop import stages
    from roboloop.evaluation.config import EvalRecipe
    from roboloop.lineage import Lineage

    monkeypatch.setenv("ROBOLOOP_ARTIFACTS", str(tmp_path / "artifacts"))
    registry = str(tmp_path / "registry")
    quiet = lambda _line: None  # noqa: E731
    checked = EvalRecipe(task=TASK, episodes=64, num_envs=16, execute_steps=4, videos=0, perturb=FACTOR,
                         gate_robustness=0.05)
    unchecked = checked.model_copy(update={"gate_robustness": None})  # the same runs, the nominal gate alone
    baseline = stages.evaluate("random", unchecked.model_copy(update={"perturb": None}), on_line=quiet)
    runs = {}
    for name, with_factor in (("robust", True), ("plain", False)):
        raw, data, model = _trained(tmp_path, with_factor)
        runs[name] = (raw, data, model, stages.evaluate(model, checked, on_line=quiet))
    lineage = {(name, recipe.gate_robustness): Lineage.of(raw, data, model, s, {"eval": recipe.model_dump()},
                                                          baseline=baseline)
               for name, (raw, data, model, s) in runs.items() for recipe in (checked, unchecked)}
    robust, fragile = runs["robust"][3], runs["plain"][3]
    moved = lambda s: s.perturbations["object_pose"]["1"]  # noqa: E731
    # what the check sees: the plain model not worse nominally, far worse with the ball where it never was
    assert fragile.success_rate >= robust.success_rate - 0.05, (fragile.outcomes, robust.outcomes)
    assert moved(robust)["success_rate"] >= 0.8, moved(robust)
    # measured on the 2-core AMD EPYC VM: both 64/64 nominally; past the range 58/64 and 32/64 (at 400 steps on
    # 96 episodes: 88/96 and 74/96; the longer-trained plain model generalises a little further)
    assert moved(fragile)["success_rate"] <= moved(robust)["success_rate"] - 0.1, (moved(fragile), moved(robust))

    for gate in (None, 0.05):  # a registry name without the check, one with it; the robust model champion of both
        name = f"reach-{gate}"
        first = stages.register(runs["robust"][2], lineage["robust", gate], name, registry=registry, margin=0.1)
        assert first.promoted, first.reason  # it beats the random policy on the same episodes
        d = stages.register(runs["plain"][2], lineage["plain", gate], name, registry=registry, margin=0.1)
        if gate is None:  # the nominal episodes alone: not worse, promoted
            assert d.promoted and "robustness" not in d.reason, d.reason
        else:
            assert not d.promoted, d.reason
            assert "robustness object_pose=1 (margin 0.05)" in d.reason, d.reason
            assert d.reason.endswith("decided by robustness: not promoted"), d.reason
