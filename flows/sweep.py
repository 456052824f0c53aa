"""Checkpoint sweep: score every kept checkpoint of a training run in simulation, plot success against the
training step, say how well offline scores (held-out action error, training loss) rank the checkpoints as the
simulator does, register the best (through the promotion gate).

The `checkpoint-sweep` deployment exposes it to the UI: the run's folder, the task and episodes per
checkpoint. Each checkpoint is evaluated on the same episodes (same seed: the same initial states),
so the plot compares checkpoints, not luck of the draw.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from pydantic import BaseModel, Field

from flows import run_name
from roboloop.evaluation.config import EvalRecipe
from roboloop.loop.sweep import Scored, best, rank_agreement
from roboloop.receipts import Decision
from tasks.evaluate import evaluate_task
from tasks.sweep import candidates_task, offline_scores_task, register_best_task, sweep_artifact


class SweepParams(BaseModel):
    run: str = Field(description="a training run's folder (artifacts/models/...): its kept checkpoints and final "
                     "model are scored")
    eval: EvalRecipe = Field(default_factory=lambda: EvalRecipe(episodes=48, videos=0),
                             description="task, episodes per checkpoint, execution settings")
    offline: bool = Field(True, description="also score every checkpoint offline (its training loss; its action error "
                          "on the episodes the run held out, if it trained with val_fraction > 0) and report how "
                          "well each score ranks the checkpoints as the simulator does (Spearman)")
    register_best: bool = Field(True, description="register the best checkpoint and run the promotion gate")
    model_name: str = Field("reach-vla", description="registry model name")
    margin: float = Field(0.05, ge=0, le=1, description="promotion non-inferiority margin on the success rate")


class SweepResult(BaseModel):
    scored: list[dict]
    best_step: int
    best_model: str
    best_success_rate: float
    plot: str
    agreement: dict | None = None
    decision: Decision | None = None


@flow(name="checkpoint-sweep", log_prints=True,
      flow_run_name=run_name("sweep {run} on {task}", run="params.run", task="params.eval.task"))
def checkpoint_sweep(params: SweepParams) -> SweepResult:
    candidates = candidates_task(params.run)
    evals = [evaluate_task(model, params.eval) for _, model in candidates]
    offline = [offline_scores_task(params.run, step, model) if params.offline else {} for step, model in candidates]
    scored = [Scored(step, m.path, e.success_rate, e.ci_low, e.ci_high, e.successes, e.episodes, o)
              for (step, m), e, o in zip(candidates, evals, offline, strict=True)]
    top = best(scored)
    agreement = rank_agreement(scored) if params.offline else None
    plot = sweep_artifact(scored, str(Path(params.run).absolute()), params.eval.task, agreement)
    decision = None
    if params.register_best:
        i = scored.index(top)
        decision = register_best_task(candidates[i][1], evals[i], top.step, params.model_name, params.margin)
    return SweepResult(scored=[s.__dict__ for s in scored], best_step=top.step, best_model=top.model,
                       best_success_rate=top.success_rate, plot=plot, agreement=agreement, decision=decision)
