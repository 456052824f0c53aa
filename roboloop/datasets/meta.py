"""Typed metadata of LeRobot datasets (v2.1 and v3.0).

`load_meta(root)` reads either version into one `DatasetMeta`: info.json, the episode table,
tasks and stats. Structural problems (unreadable JSON, missing required keys, wrong types)
raise `MetadataError` naming the file and field; content checks live in `validate`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from roboloop.datasets import layout


class MetadataError(ValueError):
    """Metadata that cannot be read at all; names the file and field."""

    def __init__(self, file: str, message: str, field: str | None = None, episode: int | None = None):
        self.file, self.field, self.episode = file, field, episode
        where = file + (f" episode {episode}" if episode is not None else "") + (f" [{field}]" if field else "")
        super().__init__(f"{where}: {message}")


class Feature(BaseModel):
    model_config = ConfigDict(extra="allow")

    dtype: str
    shape: list[int]
    names: list[str] | dict[str, Any] | None = None
    info: dict[str, Any] | None = None
    fps: float | None = None

    @property
    def is_visual(self) -> bool:
        return self.dtype in ("video", "image")


class DatasetInfo(BaseModel):
    """meta/info.json. Unknown keys are kept so that we can round-trip what we don't use."""

    model_config = ConfigDict(extra="allow")

    codebase_version: str
    fps: float = Field(gt=0)
    features: dict[str, Feature]
    total_episodes: int = Field(ge=0)
    total_frames: int = Field(ge=0)
    total_tasks: int = Field(ge=0)
    chunks_size: int = Field(default=layout.DEFAULT_CHUNK_SIZE, gt=0)
    data_path: str
    video_path: str | None = None
    robot_type: str | None = None
    splits: dict[str, str] = Field(default_factory=dict)
    # v2.1 only
    total_chunks: int | None = None
    total_videos: int | None = None
    # v3.0 only
    data_files_size_in_mb: float | None = None
    video_files_size_in_mb: float | None = None

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.dtype == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.dtype == "image"]


class Episode(BaseModel):
    """One row of the episode table; v3 location fields are None for v2.1."""

    model_config = ConfigDict(extra="allow")

    episode_index: int
    tasks: list[str]
    length: int
    data_chunk_index: int | None = None
    data_file_index: int | None = None
    dataset_from_index: int | None = None
    dataset_to_index: int | None = None
    # video_key -> {"chunk_index", "file_index", "from_timestamp", "to_timestamp"}
    videos: dict[str, dict[str, float]] = Field(default_factory=dict)


Stats = dict[str, dict[str, np.ndarray]]


class DatasetMeta(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    root: Path
    info: DatasetInfo
    episodes: list[Episode]
    tasks: dict[int, str]
    episode_stats: dict[int, Stats] = Field(default_factory=dict)
    stats: Stats | None = None

    @property
    def version(self) -> str:
        return self.info.codebase_version

    @property
    def is_v21(self) -> bool:
        return self.version == layout.V21

    def v21_data_path(self, episode_index: int) -> str:
        chunk = layout.chunk_of(episode_index, self.info.chunks_size)
        return self.info.data_path.format(episode_chunk=chunk, episode_index=episode_index)

    def v21_video_path(self, episode_index: int, video_key: str) -> str:
        assert self.info.video_path is not None
        chunk = layout.chunk_of(episode_index, self.info.chunks_size)
        return self.info.video_path.format(
            episode_chunk=chunk, episode_index=episode_index, video_key=video_key
        )


def read_json(path: Path, rel: str) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as e:
        raise MetadataError(rel, "file is missing") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MetadataError(rel, f"not valid JSON ({e})") from e


def read_jsonl(path: Path, rel: str) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError as e:
        raise MetadataError(rel, "file is missing") from e
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise MetadataError(rel, f"line {lineno} is not valid JSON ({e})") from e
    return rows


def _pydantic_error(rel: str, err: ValidationError, episode: int | None = None) -> MetadataError:
    first = err.errors()[0]
    field = ".".join(str(p) for p in first["loc"])
    return MetadataError(rel, first["msg"], field=field, episode=episode)


def load_info(root: Path) -> DatasetInfo:
    raw = read_json(root / layout.INFO_PATH, layout.INFO_PATH)
    try:
        info = DatasetInfo.model_validate(raw)
    except ValidationError as e:
        raise _pydantic_error(layout.INFO_PATH, e) from e
    for key, tmpl in (("data_path", info.data_path), ("video_path", info.video_path)):
        if tmpl is not None:
            try:
                layout.check_relative(tmpl)
            except layout.UnsafePathError as e:
                raise MetadataError(layout.INFO_PATH, str(e), field=key) from e
    return info


def stats_to_numpy(raw: dict) -> Stats:
    return {
        feat: {k: np.atleast_1d(np.asarray(v, dtype=np.float64)) for k, v in fstats.items()}
        for feat, fstats in raw.items()
    }


def _load_v21(root: Path, info: DatasetInfo) -> DatasetMeta:
    episodes = []
    for row in read_jsonl(root / layout.V21_EPISODES_PATH, layout.V21_EPISODES_PATH):
        try:
            episodes.append(Episode.model_validate(row))
        except ValidationError as e:
            raise _pydantic_error(layout.V21_EPISODES_PATH, e, row.get("episode_index")) from e
    episodes.sort(key=lambda ep: ep.episode_index)
    tasks: dict[int, str] = {}
    for row in read_jsonl(root / layout.V21_TASKS_PATH, layout.V21_TASKS_PATH):
        if not isinstance(row.get("task_index"), int) or not isinstance(row.get("task"), str):
            raise MetadataError(layout.V21_TASKS_PATH, f"row {row!r} needs int task_index and str task")
        tasks[row["task_index"]] = row["task"]
    episode_stats: dict[int, Stats] = {}
    stats_path = root / layout.V21_EPISODES_STATS_PATH
    if stats_path.exists():
        for row in read_jsonl(stats_path, layout.V21_EPISODES_STATS_PATH):
            try:
                episode_stats[int(row["episode_index"])] = stats_to_numpy(row["stats"])
            except (KeyError, TypeError, ValueError) as e:
                raise MetadataError(
                    layout.V21_EPISODES_STATS_PATH, f"malformed row ({e})", episode=row.get("episode_index")
                ) from e
    return DatasetMeta(root=root, info=info, episodes=episodes, tasks=tasks, episode_stats=episode_stats)


def _episode_from_v3_row(row: dict, video_keys: list[str]) -> tuple[Episode, Stats]:
    videos = {}
    for key in video_keys:
        prefix = f"videos/{key}/"
        if prefix + "chunk_index" in row:
            videos[key] = {
                name: row[prefix + name]
                for name in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
            }
    stats: Stats = {}
    for col, value in row.items():
        if col.startswith("stats/") and value is not None:
            _, feat_stat = col.split("/", 1)
            feat, stat = feat_stat.rsplit("/", 1)
            stats.setdefault(feat, {})[stat] = np.atleast_1d(np.asarray(value, dtype=np.float64))
    ep = Episode(
        episode_index=row["episode_index"],
        tasks=list(row["tasks"]),
        length=row["length"],
        data_chunk_index=row.get("data/chunk_index"),
        data_file_index=row.get("data/file_index"),
        dataset_from_index=row.get("dataset_from_index"),
        dataset_to_index=row.get("dataset_to_index"),
        videos=videos,
    )
    return ep, stats


def _nested_to_numpy(value: Any) -> Any:
    if isinstance(value, list):
        return np.array([_nested_to_numpy(v) for v in value])
    return value


def _load_v30(root: Path, info: DatasetInfo) -> DatasetMeta:
    ep_files = sorted((root / layout.V30_EPISODES_DIR).glob("chunk-*/file-*.parquet"))
    if not ep_files:
        raise MetadataError(layout.V30_EPISODES_DIR, "no episode parquet files")
    episodes, episode_stats = [], {}
    for path in ep_files:
        rel = path.relative_to(root).as_posix()
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for corrupt files
            raise MetadataError(rel, f"unreadable parquet ({e})") from e
        for col in ("episode_index", "tasks", "length"):
            if col not in table.column_names:
                raise MetadataError(rel, "required column is missing", field=col)
        for row in table.to_pylist():
            row = {k: _nested_to_numpy(v) if k.startswith("stats/") else v for k, v in row.items()}
            ep, ep_stats = _episode_from_v3_row(row, info.video_keys)
            episodes.append(ep)
            episode_stats[ep.episode_index] = ep_stats
    episodes.sort(key=lambda ep: ep.episode_index)
    tasks_path = root / layout.V30_TASKS_PATH
    try:
        tdf = pq.read_table(tasks_path).to_pandas()
    except FileNotFoundError as e:
        raise MetadataError(layout.V30_TASKS_PATH, "file is missing") from e
    if "task_index" not in tdf.columns:
        raise MetadataError(layout.V30_TASKS_PATH, "required column is missing", field="task_index")
    tasks = {int(i): str(t) for t, i in zip(tdf.index, tdf["task_index"], strict=True)}
    stats: Stats | None = None
    if (root / layout.STATS_PATH).exists():
        stats = stats_to_numpy(read_json(root / layout.STATS_PATH, layout.STATS_PATH))
    return DatasetMeta(
        root=root, info=info, episodes=episodes, tasks=tasks, episode_stats=episode_stats, stats=stats
    )


def load_meta(root: str | Path) -> DatasetMeta:
    """Read a v2.1 or v3.0 dataset's metadata. Raises `MetadataError` when it can't."""
    root = Path(root)
    if not root.is_dir():
        raise MetadataError(str(root), "dataset folder does not exist")
    info = load_info(root)
    if info.codebase_version == layout.V21:
        return _load_v21(root, info)
    if info.codebase_version == layout.V30:
        return _load_v30(root, info)
    raise MetadataError(
        layout.INFO_PATH,
        f"unsupported codebase_version {info.codebase_version!r} (roboloop reads v2.1 and v3.0)",
        field="codebase_version",
    )
