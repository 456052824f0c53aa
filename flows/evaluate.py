"""Evaluate a policy in simulation: a registry alias/version, a model folder, `expert` or `random`.

The `evaluate` deployment exposes this to the UI: pick the model (`registry:reach-vla@champion`,
`registry:reach-vla@3`), the task and the number of episodes.
"""

from __future__ import annotations

from prefect import flow

from roboloop.evaluation.run import EvalConfig
from tasks.evaluate import evaluate_task


@flow(name="evaluate", log_prints=True)
def evaluate_flow(params: EvalConfig = EvalConfig(), policy_md5: str = "") -> dict:
    return evaluate_task(params, policy_md5 or params.policy)
