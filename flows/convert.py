"""Convert a validated v2.1 dataset to v3.0 and version the result."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from roboloop.datasets.convert import ConvertConfig
from tasks.data import convert_task, dvc_track_task


class ConvertParams(BaseModel):
    src: str = Field("data", description="LeRobot v2.1 dataset folder")
    dst: str = Field("artifacts/dataset_v3", description="where the v3.0 dataset goes")
    raw_md5: str = Field(description="content hash of `src` (DVC md5): the cache key")
    config: ConvertConfig = Field(default_factory=ConvertConfig, description="file size / episode caps, workers")
    track: bool = Field(True, description="DVC-track (and push) the v3.0 output")


@flow(name="convert", log_prints=True)
def convert_flow(params: ConvertParams) -> dict:
    if params.src.rstrip("/").endswith(params.dst.rstrip("/")):
        raise ValueError("convert: src and dst must differ")
    dst = convert_task(params.src, params.dst, params.raw_md5, params.config)
    md5 = dvc_track_task(dst)["md5"] if params.track else params.raw_md5 + "-v3"
    return {"path": dst, "md5": md5}
