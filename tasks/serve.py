"""Serve-check task: the version the loop registered, served by `roboloop serve` and driven through it."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from roboloop.evaluation.config import EvalRecipe
from roboloop.receipts import Decision, EvalSummary
from roboloop.serving.check import ServeCheckRecipe, ServedCheck, served_check
from tasks.common import NO_CACHE, relay


@task(name="serve-check", cache_policy=NO_CACHE)
def serve_check_task(decision: Decision, recipe: EvalRecipe, reference: EvalSummary,
                     cfg: ServeCheckRecipe) -> ServedCheck:
    """Never cached: a server is asked live, and what it answers is the point."""
    s = served_check(decision, recipe, reference, cfg, on_line=relay("[serve-check] "))
    get_run_logger().info("served: %s", s.line())
    create_markdown_artifact(f"### Served: `{s.ref}`\n\n{s.line()}\n\nrun: `{s.eval_run}`", key="serve-check",
                             description="the registered version served and driven through its server")
    return s
