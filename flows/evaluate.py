"""Evaluate a policy in simulation: a registry alias or version, a model folder, `expert` or `random`.

The `evaluate` deployment exposes this to the UI: pick the model (`registry:reach-vla@champion`,
`registry:reach-vla@3`), the task and the number of episodes. Aliases are resolved to a version
(and that version to its weights) before anything is cached; every evaluation has its own run folder.
"""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field, model_validator

from flows import finish, rename, run_name
from roboloop.evaluation.config import EvalRecipe
from roboloop.loop.summary import eval_message
from roboloop.receipts import EvalSummary
from tasks.evaluate import evaluate_task


class EvaluateParams(BaseModel):
    policy: str = Field("registry:reach-vla@champion",
                        description="registry:NAME@champion, registry:NAME@3, a model folder, expert or random")
    eval: EvalRecipe = Field(default_factory=EvalRecipe, description="task, episodes, execution settings")
    against: str | None = Field(None, description="a registry model name (reach-vla): with eval.early_stop, stop as "
                                "soon as the paired decision against its champion (within margin) is certain")
    margin: float = Field(0.05, ge=0, le=1, description="with against: how much worse than the champion still "
                          "counts as not worse (the closed loop's gate margin)")

    @model_validator(mode="after")
    def _nothing_silent(self) -> EvaluateParams:
        """A setting that would do nothing in this flow is refused with the reason."""
        if self.eval.early_stop and not self.against:
            raise ValueError("eval.early_stop would do nothing: it stops once the paired decision against a champion "
                             "is certain; set against (a registry model name, e.g. reach-vla)")
        if self.against and not self.eval.early_stop:
            raise ValueError("against would do nothing: it is the champion eval.early_stop compares with; set "
                             "eval.early_stop")
        if self.eval.gate_robustness is not None or self.eval.gate_latency:
            raise ValueError("eval.gate_robustness/gate_latency would do nothing: this flow decides no promotion "
                             "(set them in a closed loop's eval)")
        return self


@flow(name="evaluate", log_prints=True,
      flow_run_name=run_name("evaluate {policy} on {task} seed {seed}", policy="params.policy",
                             task="params.eval.task", seed="params.eval.seed"))
def evaluate_flow(params: EvaluateParams = EvaluateParams()) -> EvalSummary:
    """Named by the version the alias resolved to, ending with the result as its state message."""
    s = evaluate_task(params.policy, params.eval, against=params.against, margin=params.margin)
    if s.policy != params.policy:  # an alias resolved: registry:reach-vla@champion -> reach-vla@3
        rename(f"evaluate {s.policy} on {s.task} seed {s.seed}")
    return finish(s, eval_message(s))  # type: ignore[return-value]
