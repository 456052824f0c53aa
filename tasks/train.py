"""Training task: torchrun in a child process group, its output re-logged line by line."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from roboloop import stages
from roboloop.receipts import DatasetRef, ExecutionSettings, ModelRef
from roboloop.training.config import LaunchConfig, TrainRecipe
from tasks.common import NO_CACHE, artifact_key, png_markdown, receipts, relay


@task(name="train", cache_policy=NO_CACHE)
def train_task(data: DatasetRef, recipe: TrainRecipe, launch: LaunchConfig | None = None, track: bool = True,
               execution: ExecutionSettings | None = None) -> ModelRef:
    """Train (resuming this run's checkpoints), keyed on the dataset md5 + recipe + code version.

    Cancelling the flow run or hitting `launch.timeout_s` kills torchrun's whole process group.
    """
    from tasks.nodes import pool_nodes

    nodes = pool_nodes(launch) if launch and launch.deployment else None  # the gpu pool's nodes train
    model = stages.train(data, recipe, launch, cache=receipts(), track=track, execution=execution,
                         on_line=relay("[train] "), nodes=nodes)
    row = {"model": model.path, "weights_sha256": model.weights_sha256[:16], **model.metrics}
    create_table_artifact([row], key=artifact_key("train-summary", recipe.preset),
                          description=f"{recipe.preset} on {Path(data.path).name}")
    plot = png_markdown(Path(model.path) / "loss.png", "training loss")
    if plot:
        create_markdown_artifact(f"### Training loss\n\n{plot}", key=artifact_key("train-loss", recipe.preset))
    return model
