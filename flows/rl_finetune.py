"""RL fine-tuning: a registry model version -> flow-noise PPO in Isaac Lab on Ray -> the same Evaluator ->
a new registry version whose lineage names its parent (promoted only through the gate).

The `rl-finetune` deployment exposes it to the UI (model reference, mode, budget, workers). On a
cluster the flow runs on the GPU pool and Ray either starts inside the job's pod or is reached at
`rl.ray_address` (a KubeRay cluster: see infra/kuberay/).
"""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from flows import run_name
from roboloop.evaluation.config import EvalRecipe
from roboloop.receipts import Decision
from roboloop.rl.config import RLRecipe
from tasks.evaluate import evaluate_task
from tasks.rl import register_rl_task, resolve_task, rl_task


class RLParams(BaseModel):
    model: str = Field("registry:reach-vla@champion", description="model to start from: registry:NAME@ALIAS|VERSION "
                       "or a model folder")
    rl: RLRecipe = Field(default_factory=RLRecipe, description="task, sync/async, budget, workers, PPO settings")
    eval: EvalRecipe = Field(default_factory=lambda: EvalRecipe(episodes=48, videos=2),
                             description="evaluation of the result (its task is the RL task)")
    register_result: bool = Field(True, description="register the result and run the promotion gate")
    model_name: str = Field("reach-vla", description="registry model name")
    margin: float = Field(0.05, ge=0, le=1, description="promotion non-inferiority margin on the success rate")
    timeout_s: float | None = Field(None, gt=0, description="kill the RL run (and its Ray workers) after this long")


class RLResultSummary(BaseModel):
    parent: str
    model: str
    weights_sha256: str
    success_rate: float
    ci_low: float
    ci_high: float
    decision: Decision | None = None


@flow(name="rl-finetune", log_prints=True,
      flow_run_name=run_name("rl {mode} {model} on {task}", mode="params.rl.mode", model="params.model",
                             task="params.rl.task"))
def rl_finetune(params: RLParams) -> RLResultSummary:
    parent = resolve_task(params.model)
    model = rl_task(parent, params.rl, params.timeout_s)
    recipe = params.eval.model_copy(update={"task": params.rl.task, "execute_steps": params.rl.execute_steps})
    ev = evaluate_task(model, recipe, params.model_name if params.register_result else None, params.margin)
    decision = register_rl_task(model, parent, ev, params.rl, params.model_name, params.margin) \
        if params.register_result else None
    return RLResultSummary(parent=parent.path, model=model.path, weights_sha256=model.weights_sha256,
                           success_rate=ev.success_rate, ci_low=ev.ci_low, ci_high=ev.ci_high, decision=decision)
