"""Typed metadata of LeRobot datasets (v2.0, v2.1 and v3.0).

`load_meta(root)` reads any of them into one `DatasetMeta`: info.json, the episode table,
tasks and stats. Structural problems (unreadable JSON, missing required keys, wrong types)
raise `MetadataError` naming the file and field; content checks live in `validate`.

Liberal in what we read: real datasets carry `names` as a list, a dict of lists, a nested
list or null, `robot_type: null`, unknown keys in info.json and in feature entries, and
`splits` that disagree with the episode count. LeRobot reads all of these, so we keep them
(unknown keys round-trip into converted output) and never refuse them here; what would break
training (missing files, row counts, shapes that disagree with the data) is `validate`'s job.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from roboloop.datasets import layout
from roboloop.datasets.arrowutil import read_table, to_rows_nd


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
    # Free-form in the wild: ["x", "y"], {"motors": [...]}, [[...26 names...]], null. LeRobot never checks it.
    names: Any = None
    info: dict[str, Any] | None = None
    fps: float | None = None

    @field_validator("info", mode="before")
    @classmethod
    def _info_dict_or_none(cls, v: Any) -> Any:
        return v if isinstance(v, dict) else None  # a few writers put a string or a list here

    @property
    def is_visual(self) -> bool:
        return self.dtype in ("video", "image")

    @property
    def video_info(self) -> dict[str, Any]:
        """`info` (v2.1/v3) or `video_info` (early v2.0 writers)."""
        extra = self.model_extra or {}
        legacy = extra.get("video_info")
        return self.info or (legacy if isinstance(legacy, dict) else {})

    def flat_names(self) -> list[str] | None:
        """`names` as one flat list of strings when it can be read that way (dict of lists, nested lists)."""
        out: list[str] = []

        def walk(v: Any) -> bool:
            if isinstance(v, str):
                out.append(v)
                return True
            if isinstance(v, dict):
                return all(walk(x) for x in v.values())
            if isinstance(v, list | tuple):
                return all(walk(x) for x in v)
            return False

        return out if self.names is not None and walk(self.names) else None


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
    robot_type: Any = None
    splits: dict[str, Any] | None = Field(default_factory=dict)
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
    """One row of the episode table; v3 location fields are None for v2.x."""

    model_config = ConfigDict(extra="allow")

    episode_index: int
    tasks: list[str]
    length: int

    @field_validator("tasks", mode="before")
    @classmethod
    def _one_task_as_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v  # some v2.0 writers stored a single string
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

    def dataset_stats(self) -> Stats:
        """meta/stats.json, or (when a v3 dataset lacks it) the per-episode stats aggregated as LeRobot does."""
        if self.stats is not None:
            return self.stats
        if not self.has_episode_stats:
            raise ValueError(f"{self.root}: no meta/stats.json and no complete per-episode stats")
        from roboloop.datasets.stats import aggregate

        return aggregate([self.episode_stats[ep.episode_index] for ep in self.episodes])

    @property
    def is_v2(self) -> bool:
        """v2.0 or v2.1: one parquet (and one mp4 per camera) per episode."""
        return self.version in layout.V2_VERSIONS

    @property
    def has_episode_stats(self) -> bool:
        return bool(self.episode_stats) and all(ep.episode_index in self.episode_stats for ep in self.episodes)

    def v21_data_path(self, episode_index: int) -> str:
        chunk = layout.chunk_of(episode_index, self.info.chunks_size)
        return self.info.data_path.format(episode_chunk=chunk, episode_index=episode_index)

    def v21_video_path(self, episode_index: int, video_key: str) -> str:
        assert self.info.video_path is not None
        chunk = layout.chunk_of(episode_index, self.info.chunks_size)
        return self.info.video_path.format(
            episode_chunk=chunk, episode_index=episode_index, video_key=video_key
        )


def _read_text(path: Path, rel: str) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise MetadataError(rel, "file is missing") from e
    except IsADirectoryError as e:
        raise MetadataError(rel, "is a folder, not a file") from e
    if layout.is_lfs_pointer_bytes(data):
        raise MetadataError(rel, "is a Git LFS pointer, not the file itself: the dataset was cloned without "
                            "Git LFS (run `git lfs pull` in the dataset folder)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MetadataError(rel, f"not UTF-8 text ({e})") from e


def read_json(path: Path, rel: str) -> Any:
    text = _read_text(path, rel)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise MetadataError(rel, f"not valid JSON ({e})") from e


def read_jsonl(path: Path, rel: str) -> list[dict]:
    rows = []
    for lineno, line in enumerate(_read_text(path, rel).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise MetadataError(rel, f"line {lineno} is not valid JSON ({e})") from e
        if not isinstance(row, dict):
            raise MetadataError(rel, f"line {lineno} is not a JSON object")
        rows.append(row)
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


def _load_v2(root: Path, info: DatasetInfo) -> DatasetMeta:
    """v2.0 and v2.1. v2.0 has no per-episode stats (only meta/stats.json); v2.1 has episodes_stats.jsonl.
    Missing per-episode stats are not fatal: the converter computes them from the data."""
    episodes = []
    for row in read_jsonl(root / layout.V21_EPISODES_PATH, layout.V21_EPISODES_PATH):
        try:
            episodes.append(Episode.model_validate(row))
        except ValidationError as e:
            raise _pydantic_error(layout.V21_EPISODES_PATH, e, row.get("episode_index")) from e
    episodes.sort(key=lambda ep: ep.episode_index)
    tasks: dict[int, str] = {}
    for row in read_jsonl(root / layout.V21_TASKS_PATH, layout.V21_TASKS_PATH):
        index, task = row.get("task_index"), row.get("task")
        if isinstance(index, str) and index.isdigit():
            index = int(index)
        if not isinstance(index, int) or isinstance(index, bool) or not isinstance(task, str):
            raise MetadataError(layout.V21_TASKS_PATH, f"row {row!r} needs int task_index and str task")
        tasks[index] = task
    episode_stats: dict[int, Stats] = {}
    stats_path = root / layout.V21_EPISODES_STATS_PATH
    if stats_path.exists():
        for row in read_jsonl(stats_path, layout.V21_EPISODES_STATS_PATH):
            try:
                episode_stats[int(row["episode_index"])] = stats_to_numpy(row["stats"])
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise MetadataError(
                    layout.V21_EPISODES_STATS_PATH, f"malformed row ({e})", episode=row.get("episode_index")
                ) from e
    stats = _read_stats(root)
    return DatasetMeta(root=root, info=info, episodes=episodes, tasks=tasks, episode_stats=episode_stats,
                       stats=stats)


def _read_stats(root: Path) -> Stats | None:
    if not (root / layout.STATS_PATH).exists():
        return None
    raw = read_json(root / layout.STATS_PATH, layout.STATS_PATH)
    try:
        return stats_to_numpy(raw)
    except (TypeError, ValueError, AttributeError) as e:
        raise MetadataError(layout.STATS_PATH, f"malformed stats ({e})") from e


def _episode_from_v3_row(row: dict, video_keys: list[str]) -> Episode:
    videos = {}
    for key in video_keys:
        prefix = f"videos/{key}/"
        if prefix + "chunk_index" in row:
            videos[key] = {
                name: row[prefix + name]
                for name in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
            }
    return Episode(
        episode_index=row["episode_index"],
        tasks=row["tasks"] if isinstance(row["tasks"], str) else list(row["tasks"] or []),
        length=row["length"],
        data_chunk_index=row.get("data/chunk_index"),
        data_file_index=row.get("data/file_index"),
        dataset_from_index=row.get("dataset_from_index"),
        dataset_to_index=row.get("dataset_to_index"),
        videos=videos,
    )


def _load_v30(root: Path, info: DatasetInfo) -> DatasetMeta:
    ep_files = sorted((root / layout.V30_EPISODES_DIR).glob("chunk-*/file-*.parquet"))
    if not ep_files:
        raise MetadataError(layout.V30_EPISODES_DIR, "no episode parquet files")
    episodes, episode_stats = [], {}
    for path in ep_files:
        rel = path.relative_to(root).as_posix()
        table = _read_meta_parquet(path, rel)
        for col in ("episode_index", "tasks", "length"):
            if col not in table.column_names:
                raise MetadataError(rel, "required column is missing", field=col)
        stats_cols = [c for c in table.column_names if c.startswith("stats/")]
        plain = table.drop_columns(stats_cols).to_pylist()
        # stats/<feature>/<stat> columns (the feature's name may hold "/"), each converted in one go
        per_col = [(*c.split("/", 1)[1].rsplit("/", 1), to_rows_nd(table[c])) for c in stats_cols]
        for i, row in enumerate(plain):
            ep = _episode_from_v3_row(row, info.video_keys)
            ep_stats: Stats = {}
            for feat, stat, values in per_col:
                if values[i] is not None:
                    ep_stats.setdefault(feat, {})[stat] = values[i]
            episodes.append(ep)
            episode_stats[ep.episode_index] = ep_stats
    episodes.sort(key=lambda ep: ep.episode_index)
    tasks = _read_v30_tasks(root)
    stats = _read_stats(root)
    return DatasetMeta(
        root=root, info=info, episodes=episodes, tasks=tasks, episode_stats=episode_stats, stats=stats
    )


def _read_meta_parquet(path: Path, rel: str):
    """A metadata parquet file, or a MetadataError naming why it cannot be read (LFS pointer, corrupt)."""
    if layout.is_lfs_pointer(path):
        raise MetadataError(rel, "is a Git LFS pointer, not the file itself (run `git lfs pull`)")
    try:
        return read_table(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise MetadataError(rel, f"unreadable parquet ({e})") from e


def _read_v30_tasks(root: Path) -> dict[int, str]:
    """meta/tasks.parquet: pandas wrote the task strings as its index (a `task` or `__index_level_0__` column)."""
    rel = layout.V30_TASKS_PATH
    path = root / rel
    if not path.exists():
        raise MetadataError(rel, "file is missing")
    table = _read_meta_parquet(path, rel)
    if "task_index" not in table.column_names:
        raise MetadataError(rel, "required column is missing", field="task_index")
    text_cols = [c for c in ("task", "__index_level_0__") if c in table.column_names]
    if not text_cols:
        raise MetadataError(rel, "no task strings (expected a `task` column or index)", field="task")
    return {int(i): str(t) for t, i in zip(table[text_cols[0]].to_pylist(), table["task_index"].to_pylist(),
                                           strict=True)}


def load_meta(root: str | Path) -> DatasetMeta:
    """Read a v2.1 or v3.0 dataset's metadata. Raises `MetadataError` when it can't."""
    root = Path(root)
    if not root.exists():
        raise MetadataError(str(root), "dataset folder does not exist")
    if not root.is_dir():
        raise MetadataError(str(root), "is a file, not a dataset folder (a folder with meta/info.json)")
    info = load_info(root)
    if info.codebase_version in layout.V2_VERSIONS:
        return _load_v2(root, info)
    if info.codebase_version == layout.V30:
        return _load_v30(root, info)
    raise MetadataError(
        layout.INFO_PATH,
        f"unsupported codebase_version {info.codebase_version!r} (roboloop reads v2.0, v2.1 and v3.0)",
        field="codebase_version",
    )
