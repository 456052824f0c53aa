"""Train the VLA under torchrun (CPU pool: 1 process; GPU pool: one rank per GPU, multi-node)."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from flows import finish, run_name
from roboloop.loop.summary import train_message
from roboloop.receipts import ModelRef
from roboloop.training.config import LaunchConfig, TrainRecipe
from tasks.data import ingest_task
from tasks.train import train_task


class TrainParams(BaseModel):
    dataset: str = Field("artifacts/dataset_v3", description="LeRobot v3.0 dataset: a folder or s3://bucket/prefix")
    train: TrainRecipe = Field(default_factory=TrainRecipe, description="model preset, steps, precision, ...")
    launch: LaunchConfig | None = Field(None, description="ranks and nodes; empty: what the work pool's job sets")
    track: bool = Field(True, description="DVC-track the model folder (checkpoints excluded by .dvcignore)")


@flow(name="train", log_prints=True,
      flow_run_name=run_name("train {preset} on {data}", preset="params.train.preset", data="params.dataset"))
def train_flow(params: TrainParams = TrainParams()) -> ModelRef:
    data = ingest_task(params.dataset, track=params.track)
    model = train_task(data, params.train, params.launch, track=params.track)
    return finish(model, train_message(model))  # type: ignore[return-value]
