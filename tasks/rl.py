"""RL tasks: fine-tuning on Ray in a child process group, its curve as an artifact, registration with its parent."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from roboloop import stages
from roboloop.receipts import Decision, EvalSummary, ModelRef
from roboloop.rl.config import RLRecipe
from tasks.common import NO_CACHE, artifact_key, png_markdown, receipts, relay
from tasks.register import register_task


@task(name="resolve-model", cache_policy=NO_CACHE)
def resolve_task(ref: str) -> ModelRef:
    model = stages.resolve_policy(ref)
    if model is None:
        raise ValueError(f"{ref}: RL fine-tunes a trained model (a folder or registry:NAME@ALIAS), not {ref!r}")
    return model


@task(name="rl-finetune", cache_policy=NO_CACHE)
def rl_task(parent: ModelRef, recipe: RLRecipe, timeout_s: float | None = None, track: bool = False) -> ModelRef:
    """Cancelling the flow run kills the child's process group: the driver, and with it Ray and every worker."""
    from roboloop.rl.run import plot_metrics, read_metrics

    model = stages.rl_finetune(parent, recipe, cache=receipts(), on_line=relay("[rl] "), timeout_s=timeout_s,
                               track=track)
    run = Path(model.path).parent
    rows = read_metrics(run)
    if rows:
        png = plot_metrics(rows, run / "rl.png", f"{recipe.mode} RL on {recipe.task}")
        last = rows[-1]
        create_markdown_artifact(
            f"### RL fine-tuning ({recipe.mode}) on {recipe.task}\n\n{png_markdown(png, 'rollout success')}\n\n"
            f"| updates | env steps | env steps/s | dropped segments | max staleness |\n|---|---|---|---|---|\n"
            f"| {last['version']} | {last['env_steps']} | {last['env_steps'] / max(last['wall_s'], 1e-9):.0f} | "
            f"{last['dropped_segments']} | {max(r['staleness_max'] for r in rows)} |",
            key=artifact_key("rl", recipe.mode, recipe.task), description="rollout success during RL")
    return model


@task(name="register-rl", cache_policy=NO_CACHE)
def register_rl_task(model: ModelRef, parent: ModelRef, ev: EvalSummary, recipe: RLRecipe, name: str,
                     margin: float) -> Decision:
    from roboloop.loop.run import rl_lineage

    return register_task.fn(model, rl_lineage(model, parent, ev, recipe), name, margin=margin)
