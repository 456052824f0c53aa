"""Configuration of the dataset stages, importable without numpy/pyarrow (the CLI builds its options from it)."""

from __future__ import annotations

import os
from typing import ClassVar

from pydantic import BaseModel, Field

from roboloop.datasets import layout


class ConvertConfig(BaseModel):
    # cache keys (roboloop.keys): what shapes the output, and what only changes how fast or how often
    KEYED: ClassVar[frozenset[str]] = frozenset({
        "data_file_size_in_mb", "max_episodes_per_file", "validate_deep", "video_file_size_in_mb"})
    NOT_KEYED: ClassVar[frozenset[str]] = frozenset({"progress", "workers"})

    data_file_size_in_mb: float = Field(layout.DEFAULT_DATA_FILE_SIZE_IN_MB, gt=0, description="cap per data file")
    video_file_size_in_mb: float = Field(layout.DEFAULT_VIDEO_FILE_SIZE_IN_MB, gt=0, description="cap per mp4")
    max_episodes_per_file: int | None = Field(None, ge=1, description="optional cap on episodes per file")
    workers: int | None = Field(None, ge=1, description="parallel jobs (empty: one per CPU core)")
    validate_deep: bool = Field(False, description="decode every frame while validating the source")
    progress: bool = Field(True, description="show a progress bar")

    @property
    def num_workers(self) -> int:
        return self.workers or os.cpu_count() or 1


DEFAULT_TASKS = (
    "pick up the red cube",
    "push the blue block to the left",
    "reach the green ball",
    "open the drawer",
    "stack the yellow cube on the red cube",
)


class GenSpec(BaseModel):
    num_episodes: int = Field(10, ge=1, description="number of episodes")
    min_length: int = Field(20, ge=2, description="shortest episode, frames")
    max_length: int = Field(40, ge=2, description="longest episode, frames")
    fps: float = Field(30, gt=0, description="frames per second (non-integer rates such as 29.97 are kept exactly)")
    cameras: dict[str, tuple[int, int]] = Field(
        default_factory=lambda: {"observation.images.top": (48, 64), "observation.images.wrist": (48, 64)},
        description="video features: key -> (height, width)",
    )
    image_keys: dict[str, tuple[int, int]] = Field(
        default_factory=dict, description="image features stored as PNG inside parquet"
    )
    codec: str = Field("libx264", description="libx264 (h264) or libsvtav1 (AV1)")
    crf: int = 23
    noise: int = Field(0, ge=0, le=128, description="per-pixel noise amplitude (raises bitrate)")
    state_dim: int = 6
    action_dim: int = 6
    tasks: tuple[str, ...] = DEFAULT_TASKS
    chunks_size: int = layout.DEFAULT_CHUNK_SIZE
    robot_type: str = "synthetic_arm"
    seed: int = 0
