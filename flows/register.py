"""Register a trained model with its lineage; promote it only if it is not worse than the champion."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from roboloop.lineage import Lineage
from tasks.register import register_task


class RegisterParams(BaseModel):
    name: str = Field("reach-vla", description="model name in the registry")
    model_dir: str = Field(description="folder written by `roboloop train`")
    lineage: Lineage = Field(description="git commit, DVC md5s, config, metrics, eval report")
    registry: str | None = Field(None, description="registry URI (folder or s3://); default $ROBOLOOP_REGISTRY")
    margin: float = Field(0.05, ge=0, le=1, description="non-inferiority margin on the success rate")
    promote: bool = Field(True, description="run the promotion gate")


@flow(name="register", log_prints=True)
def register_flow(params: RegisterParams) -> dict:
    return register_task(params.name, params.model_dir, params.lineage, params.registry, params.margin,
                         params.promote)
