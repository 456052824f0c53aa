"""Train the VLA under torchrun (CPU pool: 1 process; GPU pool: one rank per GPU, multi-node)."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from roboloop.training.config import TrainConfig
from roboloop.training.launch import LaunchConfig
from tasks.data import dvc_track_task
from tasks.train import train_task


class TrainParams(BaseModel):
    train: TrainConfig = Field(description="model preset, steps, precision, checkpoints, ...")
    launch: LaunchConfig = Field(default_factory=LaunchConfig, description="ranks, nodes, rendezvous, timeout")
    dataset_md5: str | None = Field(None, description="DVC md5 of the dataset (computed when omitted)")
    track: bool = Field(True, description="DVC-track the model folder (checkpoints excluded by .dvcignore)")


@flow(name="train", log_prints=True)
def train_flow(params: TrainParams) -> dict:
    md5 = params.dataset_md5 or dvc_track_task(params.train.dataset)["md5"]
    summary = train_task(params.train, params.launch, md5)
    summary["model_md5"] = dvc_track_task(summary["output_dir"])["md5"] if params.track else None
    summary["dataset_md5"] = md5
    return summary
