"""RL tasks: fine-tuning on Ray in a child process group, its curve as an artifact, registration with its parent."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from roboloop import stages
from roboloop.lineage import Lineage
from roboloop.receipts import DatasetRef, Decision, EvalSummary, ModelRef
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


def _dataset_of(parent: ModelRef) -> DatasetRef:
    """The dataset the parent was cloned on: from its registry lineage, else its training config's folder."""
    if parent.registry and parent.name and parent.version:
        from roboloop.registry import Registry

        lin = Registry(parent.registry).lineage(parent.name, parent.version)
        if lin.get("dataset"):
            return DatasetRef.model_validate(lin["dataset"])
    path = parent.config.get("dataset", "")
    if not path or not Path(path).is_dir():
        raise FileNotFoundError(f"{parent.path}: its training dataset {path!r} is not here and it has no registry "
                                "lineage; the registry needs the dataset's md5 (restore it with dvc pull)")
    return stages.dataset_ref(path)


@task(name="register-rl", cache_policy=NO_CACHE)
def register_rl_task(model: ModelRef, parent: ModelRef, ev: EvalSummary, recipe: RLRecipe, name: str,
                     margin: float) -> Decision:
    parents = [f"{parent.name}@v{parent.version}"] if parent.version else [parent.path]
    lineage = Lineage.of(None, _dataset_of(parent), model, ev, parents=parents,
                         configs={"rl": recipe.model_dump(mode="json"), "parent_weights": parent.weights_sha256})
    return register_task.fn(model, lineage, name, margin=margin)
