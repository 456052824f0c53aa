"""Evaluate a policy in simulation: a registry alias or version, a model folder, `expert` or `random`.

The `evaluate` deployment exposes this to the UI: pick the model (`registry:reach-vla@champion`,
`registry:reach-vla@3`), the task and the number of episodes. Aliases are resolved to a version
(and that version to its weights) before anything is cached; every evaluation has its own run folder.
"""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from flows import finish, rename, run_name
from roboloop.evaluation.config import EvalRecipe
from roboloop.receipts import EvalSummary
from roboloop.summary import eval_message
from tasks.evaluate import evaluate_task


class EvaluateParams(BaseModel):
    policy: str = Field("registry:reach-vla@champion",
                        description="registry:NAME@champion, registry:NAME@3, a model folder, expert or random")
    eval: EvalRecipe = Field(default_factory=EvalRecipe, description="task, episodes, execution settings")


@flow(name="evaluate", log_prints=True,
      flow_run_name=run_name("evaluate {policy} on {task} seed {seed}", policy="params.policy",
                             task="params.eval.task", seed="params.eval.seed"))
def evaluate_flow(params: EvaluateParams = EvaluateParams()) -> EvalSummary:
    """Named by the version the alias resolved to, ending with the result as its state message."""
    s = evaluate_task(params.policy, params.eval)
    if s.policy != params.policy:  # an alias resolved: registry:reach-vla@champion -> reach-vla@3
        rename(f"evaluate {s.policy} on {s.task} seed {s.seed}")
    return finish(s, eval_message(s))  # type: ignore[return-value]
