"""Ingest a LeRobot dataset (folder or S3), validate it, version it with DVC."""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from pydantic import BaseModel, Field

from roboloop.evaluation.run import CollectConfig
from tasks.data import collect_task, dvc_track_task, ingest_task


class IngestParams(BaseModel):
    source: str = Field("data", description="dataset folder or s3://bucket/prefix (LeRobot v2.1 or v3.0)")
    deep: bool = Field(False, description="also decode videos and check them against the rows")
    track: bool = Field(True, description="DVC-track (and push) the raw dataset when it is a local folder")
    collect_if_missing: CollectConfig | None = Field(
        None, description="record scripted-expert demos into `source` when it does not exist yet")


@flow(name="ingest", log_prints=True)
def ingest_flow(params: IngestParams = IngestParams()) -> dict:
    if params.collect_if_missing and not params.source.startswith("s3://") \
            and not (Path(params.source) / "meta" / "info.json").exists():
        collect_task(params.collect_if_missing.model_copy(update={"dst": params.source}))
    result = ingest_task(params.source, deep=params.deep)
    if params.track and not params.source.startswith("s3://"):
        result["md5"] = dvc_track_task(result["path"])["md5"]
    else:
        result["md5"] = result["content_hash"]
    return result
