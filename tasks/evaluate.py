"""Evaluation task: the simulator runs in a child process group (one Isaac Lab sim per process)."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from roboloop import stages
from roboloop.evaluation.config import EvalRecipe
from roboloop.receipts import EvalSummary, ModelRef
from tasks.common import NO_CACHE, artifact_key, png_markdown, receipts, relay


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(policy: str | ModelRef, recipe: EvalRecipe) -> EvalSummary:
    """Exactly `recipe.episodes` episodes; keyed on the policy's weights (aliases resolved first) + recipe + code."""
    s = stages.evaluate(policy, recipe, cache=receipts(), on_line=relay("[eval] "))
    key = artifact_key("eval", s.policy, s.task)
    create_table_artifact([{"policy": s.policy, "task": s.task, "episodes": s.episodes, "successes": s.successes,
                            "success_rate": round(s.success_rate, 3), "ci_low": round(s.ci_low, 3),
                            "ci_high": round(s.ci_high, 3), "execute_steps": s.execution.execute_steps,
                            "run": s.run_dir}], key=key, description=f"{s.policy} on {s.task}")
    plot = png_markdown(s.plot and f"{s.run_dir}/eval.png", f"success of {s.policy}")
    if plot:
        create_markdown_artifact(f"### {s.policy} on {s.task}\n\n{plot}", key=key + "-plot")
    return s
