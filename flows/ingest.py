"""Ingest a LeRobot dataset (folder or S3), validate it, version it with DVC."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from flows import run_name
from roboloop.evaluation.config import CollectConfig
from roboloop.receipts import DatasetRef
from tasks.data import ingest_task


class IngestParams(BaseModel):
    source: str = Field("data", description="dataset folder or s3://bucket/prefix (LeRobot v2.0, v2.1 or v3.0)")
    deep: bool = Field(False, description="also decode every video frame and check it against the rows")
    track: bool = Field(True, description="DVC-track (and push) the dataset when it is a local folder")
    collect_if_missing: CollectConfig | None = Field(
        None, description="record scripted-expert demos into `source` when that folder does not exist yet")


@flow(name="ingest", log_prints=True, flow_run_name=run_name("ingest {source}", source="params.source"))
def ingest_flow(params: IngestParams = IngestParams()) -> DatasetRef:
    return ingest_task(params.source, params.collect_if_missing, deep=params.deep, track=params.track)
