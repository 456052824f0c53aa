"""Convert a LeRobot v2.x dataset to v3.0 (validated first) and version the result."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from flows import run_name
from roboloop.datasets.config import ConvertConfig
from roboloop.receipts import DatasetRef
from tasks.data import convert_task, ingest_task


class ConvertParams(BaseModel):
    src: str = Field("data", description="LeRobot v2.0/v2.1 dataset: a folder or s3://bucket/prefix")
    config: ConvertConfig = Field(default_factory=lambda: ConvertConfig(progress=False),
                                  description="file size / episode caps, workers")
    track: bool = Field(True, description="DVC-track (and push) the source and the v3.0 output")


@flow(name="convert", log_prints=True, flow_run_name=run_name("convert {src}", src="params.src"))
def convert_flow(params: ConvertParams = ConvertParams()) -> DatasetRef:
    raw = ingest_task(params.src, track=params.track)
    return convert_task(raw, params.config, track=params.track)
