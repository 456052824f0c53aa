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
    run = model.metrics.get("run") or {}
    row = {"model": model.path, "weights_sha256": model.weights_sha256[:16],
           **{k: v for k, v in model.metrics.items() if k != "run"}}
    create_table_artifact([row], key=artifact_key("train-summary", recipe.preset),
                          description=f"{recipe.preset} on {Path(data.path).name}")
    plot = png_markdown(Path(model.path) / "loss.png", "training loss")
    parts = [f"### Training loss\n\n{plot}"] if plot else []
    parts += run_record_markdown(run)
    if parts:
        create_markdown_artifact("\n".join(parts), key=artifact_key("train-loss", recipe.preset),
                                 description=f"loss curve and run record of {Path(model.path).name}")
    return model


def run_record_markdown(run: dict) -> list[str]:
    """The run record (metrics.jsonl's `run`: precision, attention, compile, optimizer, ... and why each was chosen)
    as a two-column table, nested records flattened (compile.why)."""
    if not run:
        return []
    rows: list[tuple[str, object]] = []
    for key, value in run.items():
        if key == "fp8_linear_names":
            continue
        if isinstance(value, dict):
            rows += [(f"{key}.{k}", v) for k, v in value.items()]
        else:
            rows.append((key, value))
    cell = lambda v: str(v).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    return ["", "### Run record", "", "| setting | value |", "|---|---|", *(f"| {k} | {cell(v)} |" for k, v in rows)]
