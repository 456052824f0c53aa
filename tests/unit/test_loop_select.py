"""`LoopConfig.select`: the loop plays a training run's kept checkpoints and final model on validation episodes of
their own seed and carries the best on; the gate, the registry and the summary see the pick.

The stages here are stand-ins that record their calls (the real ones run in tests/isaac/test_so101_task.py's short
SO-101 loop); what is under test is the loop's wiring: which episodes pick, which model goes on, what is recorded.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from roboloop.evaluation.config import EvalRecipe
from roboloop.loop import LoopConfig, SelectRecipe, so101
from roboloop.loop.run import run_loop
from roboloop.receipts import DatasetRef, Decision, EvalSummary, ModelRef
from roboloop.training.config import TrainRecipe

TASK = "Roboloop-SO101-PickCube-v0"


def _model(path: str, loss: float | None = None) -> ModelRef:
    return ModelRef(path=path, weights_sha256=path.rsplit("/", 1)[-1].ljust(8, "0"), md5="m", dataset_md5="d",
                    config={"seed": 0}, metrics={"final_loss": loss} if loss is not None else {})


class Recorded:
    """Stage calls as a loop makes them; `val` maps a model path to its successes on the validation episodes."""

    def __init__(self, val: dict[str, int], kept: list[int], final: int = 100):
        self.val, self.kept, self.final = val, kept, final
        self.evals: list[tuple[str, EvalRecipe]] = []
        self.registered: list[tuple[ModelRef, dict]] = []

    def ingest(self, source, collect, track):
        return DatasetRef(path="/raw", md5="r", format="v2.1", num_episodes=10, num_frames=100, fps=30)

    def convert(self, raw, cfg, track):
        return DatasetRef(path="/v3", md5="d", format="v3.0", num_episodes=10, num_frames=100, fps=30)

    def train(self, data, recipe, launch, track, execution):
        return _model("/runs/run", loss=0.1)

    def candidates(self, model, track):
        return [*((s, _model(f"/runs/run-step{s:08d}")) for s in self.kept), (self.final, model)]

    def evaluate(self, policy, recipe, against=None, margin=0.05):
        path = policy if isinstance(policy, str) else policy.path
        self.evals.append((path, recipe))
        n = recipe.episodes
        k = self.val.get(path, 0) if recipe.seed != 0 else n // 2  # eval.seed is 0 here
        return EvalSummary(run_dir=f"/evals/{len(self.evals)}", report_sha256="x", policy=path, policy_id=path,
                           task=recipe.task, episodes=n, successes=k, success_rate=k / n, ci_low=0.0, ci_high=1.0,
                           seed=recipe.seed)

    def register(self, model, lineage, name, margin):
        self.registered.append((model, lineage.model_dump(mode="json")))
        return Decision(registry="/reg", name=name, version=len(self.registered), promoted=True, reason="ok")


def _cfg(**select) -> LoopConfig:
    return LoopConfig(source="/raw", train=TrainRecipe(steps=100, checkpoint_every_steps=25),
                      eval=EvalRecipe(task=TASK, episodes=8, seed=0), select=SelectRecipe(episodes=6, **select),
                      track=False)


def test_the_best_checkpoint_on_validation_episodes_is_evaluated_registered_and_summarised():
    steps = Recorded(val={"/runs/run-step00000050": 5, "/runs/run-step00000075": 3, "/runs/run": 2}, kept=[50, 75])
    s = run_loop(_cfg(seed=7), steps)
    picked = "/runs/run-step00000050"
    # every candidate on the same validation episodes (select's seed and count, no videos), then the pick on the
    # reported episodes (eval's seed), then random on those
    assert [(p, r.seed, r.episodes, r.videos) for p, r in steps.evals[:3]] == [
        ("/runs/run-step00000050", 7, 6, 0), ("/runs/run-step00000075", 7, 6, 0), ("/runs/run", 7, 6, 0)]
    assert [(p, r.seed, r.episodes) for p, r in steps.evals[3:]] == [(picked, 0, 8), ("random", 0, 8)]
    model, lineage = steps.registered[0]
    assert model.path == picked and s.model == picked
    sel = lineage["config"]["select"]
    assert (sel["picked_step"], sel["final_step"], sel["seed"]) == (50, 100, 7)
    assert [(c["step"], c["successes"]) for c in sel["candidates"]] == [(50, 5), (75, 3), (100, 2)]
    # the summary names the pick and still reports the training run's loss
    assert s.final_loss == 0.1 and s.selections[0].picked_step == 50
    line = next(x for x in s.human() if "checkpoint picked" in x)
    assert "step 50 of 100" in line and "100 (final): 2/6" in line and "seed 7" in line
    assert "| checkpoint picked | step 50 of 100" in s.markdown()


def test_a_tie_goes_to_the_later_step_and_a_lone_final_model_is_said_to_be_the_only_one():
    steps = Recorded(val={"/runs/run-step00000050": 4, "/runs/run": 4}, kept=[50])
    s = run_loop(_cfg(), steps)
    assert s.model == "/runs/run" and s.selections[0].picked_step == 100

    lone = Recorded(val={}, kept=[])
    s = run_loop(_cfg(), lone)
    assert [p for p, _ in lone.evals] == ["/runs/run", "random"]  # nothing to pick among: no validation episodes
    assert "nothing to pick" in s.selections[0].line()


def test_dagger_rounds_pick_too_and_continue_from_the_pick():
    class Rounds(Recorded):
        def __init__(self):
            super().__init__(val={"/runs/run-step00000050": 6}, kept=[50])
            self.inits: list[str | None] = []

        def train(self, data, recipe, launch, track, execution):
            self.inits.append(recipe.init_from)
            return _model("/runs/run", loss=0.1)

        def dagger_collect(self, model, recipe, round_, track):
            return DatasetRef(path="/visited", md5="v", format="v2.1", num_episodes=2, num_frames=20, fps=30)

        def aggregate(self, sources, round_, track):
            return DatasetRef(path=f"/agg{round_}", md5=f"a{round_}", format="v2.1", num_episodes=12,
                              num_frames=120, fps=30)

    steps = Rounds()
    cfg = _cfg().model_copy(update={"rounds": 2})
    s = run_loop(cfg, steps)
    assert steps.inits == [None, "/runs/run-step00000050"]  # round 1 continues from round 0's pick
    assert [p.round for p in s.selections] == [0, 1]


def test_select_is_refused_where_it_would_mislead_or_do_nothing():
    with pytest.raises(ValidationError, match="equals eval.seed"):
        _cfg(seed=0)
    with pytest.raises(ValidationError, match="keeps none before step 100"):
        LoopConfig(train=TrainRecipe(steps=100, checkpoint_every_steps=0), select=SelectRecipe())
    with pytest.raises(ValidationError, match="evaluation 'offline'"):
        LoopConfig(evaluation="offline", train=TrainRecipe(val_fraction=0.1), select=SelectRecipe())
    # a user's recordings evaluated offline: the SO-101 preset's pick is dropped, not refused
    from roboloop.loop import for_source

    assert for_source(so101(), "/recordings/arm").select is None
    assert for_source(so101(), "/recordings/arm", "simulator").select == so101().select
