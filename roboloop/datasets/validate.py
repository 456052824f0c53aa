"""Find every defect of a LeRobot dataset (v2.1 or v3.0) and say exactly where it is.

Each `Defect` names a code (the defect class), the file, the episode and the field. The
checks: metadata readable and typed; paths that would escape the root (refused outright);
missing, extra and misplaced data/video files (a misplaced file is reported with where it
actually is); row counts against info.json and the episode table; episode and global index
continuity; timestamps monotonic and on the fps grid; feature dtype/shape against the
parquet schema; video frame count, fps and resolution against the metadata; task indices
that don't resolve; missing stats. `deep=True` also decodes every video frame.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from roboloop.datasets import layout, video
from roboloop.datasets.meta import DatasetMeta, Episode, Feature, MetadataError, load_meta

TS_TOLERANCE_S = 1e-4  # LeRobot's own tolerance when matching timestamps to frames
ARROW_DTYPES = {
    "float32": pa.float32(), "float64": pa.float64(), "int64": pa.int64(), "int32": pa.int32(),
    "int16": pa.int16(), "int8": pa.int8(), "uint8": pa.uint8(), "bool": pa.bool_(), "string": pa.string(),
}


@dataclass(frozen=True)
class Defect:
    code: str
    message: str
    file: str | None = None
    episode: int | None = None
    field: str | None = None

    def human(self) -> str:
        where = [p for p in (self.file, f"episode {self.episode}" if self.episode is not None else None,
                             f"field {self.field}" if self.field else None) if p]
        return f"[{self.code}] {' | '.join(where)}: {self.message}"


@dataclass
class Report:
    root: str
    version: str | None = None
    num_episodes: int = 0
    num_frames: int = 0
    defects: list[Defect] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.defects

    def add(self, code: str, message: str, file: str | None = None, episode: int | None = None,
            field: str | None = None) -> None:
        self.defects.append(Defect(code, message, file, episode, field))

    def codes(self) -> set[str]:
        return {d.code for d in self.defects}

    def to_dict(self) -> dict:
        return {"root": self.root, "version": self.version, "ok": self.ok, "num_episodes": self.num_episodes,
                "num_frames": self.num_frames, "num_defects": len(self.defects),
                "defects": [asdict(d) for d in self.defects]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def human(self, limit: int = 200) -> str:
        head = f"{self.root} ({self.version or 'unknown version'}): {self.num_episodes} episodes, " \
               f"{self.num_frames} frames - "
        if self.ok:
            return head + "no defects"
        lines = [head + f"{len(self.defects)} defect(s)"]
        lines += ["  " + d.human() for d in self.defects[:limit]]
        if len(self.defects) > limit:
            lines.append(f"  ... {len(self.defects) - limit} more (use --json for all)")
        return "\n".join(lines)


class DatasetDefectError(ValueError):
    """Raised by consumers (convert, ingest) that refuse a defective dataset; carries the report."""

    def __init__(self, report: Report):
        self.report = report
        super().__init__("dataset has defects:\n" + report.human(limit=50))


def validate(root: str | Path, deep: bool = False, workers: int = 8) -> Report:
    root = Path(root)
    report = Report(root=str(root))
    try:
        meta = load_meta(root)
    except layout.UnsafePathError as e:  # pragma: no cover - load_meta wraps these
        report.add("unsafe_path", str(e))
        return report
    except MetadataError as e:
        code = "unsafe_path" if "escapes" in str(e) or "absolute path" in str(e) else "metadata"
        report.add(code, str(e).split(": ", 1)[-1], file=e.file, episode=e.episode, field=e.field)
        return report
    report.version = meta.version
    report.num_episodes = len(meta.episodes)
    report.num_frames = sum(ep.length for ep in meta.episodes)
    _check_episode_table(meta, report)
    _check_tasks_and_stats(meta, report)
    if meta.is_v21:
        _check_v21_files(meta, report, deep, workers)
    else:
        _check_v30_files(meta, report, deep, workers)
    return report


# ---------------------------------------------------------------- metadata-level checks
def _check_episode_table(meta: DatasetMeta, report: Report) -> None:
    info = meta.info
    eps_file = layout.V21_EPISODES_PATH if meta.is_v21 else layout.V30_EPISODES_DIR
    indices = [ep.episode_index for ep in meta.episodes]
    dupes = sorted({i for i in indices if indices.count(i) > 1})
    for i in dupes:
        report.add("episode_index", "episode listed more than once", eps_file, i, "episode_index")
    expected = set(range(len(set(indices))))
    for i in sorted(set(indices) - expected):
        report.add("episode_index", f"episode indices must be 0..{len(expected) - 1} without gaps",
                   eps_file, i, "episode_index")
    for i in sorted(expected - set(indices)):
        report.add("episode_index", "episode missing from the episode table (gap)", eps_file, i, "episode_index")
    if info.total_episodes != len(meta.episodes):
        report.add("row_count", f"info says {info.total_episodes} episodes, the episode table has "
                   f"{len(meta.episodes)}", layout.INFO_PATH, None, "total_episodes")
    total = sum(ep.length for ep in meta.episodes)
    if info.total_frames != total:
        report.add("row_count", f"info says {info.total_frames} frames, episode lengths sum to {total}",
                   layout.INFO_PATH, None, "total_frames")
    if info.total_tasks != len(meta.tasks):
        report.add("row_count", f"info says {info.total_tasks} tasks, the task table has {len(meta.tasks)}",
                   layout.INFO_PATH, None, "total_tasks")
    for ep in meta.episodes:
        if ep.length <= 0:
            report.add("row_count", f"length {ep.length} must be positive", eps_file, ep.episode_index, "length")


def _check_tasks_and_stats(meta: DatasetMeta, report: Report) -> None:
    task_strings = set(meta.tasks.values())
    tasks_file = layout.V21_TASKS_PATH if meta.is_v21 else layout.V30_TASKS_PATH
    eps_file = layout.V21_EPISODES_PATH if meta.is_v21 else layout.V30_EPISODES_DIR
    for ep in meta.episodes:
        for t in ep.tasks:
            if t not in task_strings:
                report.add("task", f"task {t!r} is not in {tasks_file}", eps_file, ep.episode_index, "tasks")
    stat_feats = [k for k, f in meta.info.features.items() if f.dtype not in ("string", "language")]
    if meta.is_v21:
        sfile = layout.V21_EPISODES_STATS_PATH
        if not (meta.root / sfile).exists():
            report.add("stats", "per-episode stats file is missing", sfile)
            return
    else:
        sfile = layout.V30_EPISODES_DIR
        if meta.stats is None:
            report.add("stats", "dataset stats file is missing", layout.STATS_PATH)
    for ep in meta.episodes:
        ep_stats = meta.episode_stats.get(ep.episode_index)
        if ep_stats is None:
            report.add("stats", "no stats for this episode", sfile, ep.episode_index)
            continue
        for feat in stat_feats:
            missing = [s for s in ("min", "max", "mean", "std", "count") if s not in ep_stats.get(feat, {})]
            if missing:
                report.add("stats", f"missing {', '.join(missing)}", sfile, ep.episode_index, feat)


# ---------------------------------------------------------------- parquet checks
def _expected_arrow(feat: Feature) -> tuple[pa.DataType, int | None] | None:
    """(value type, list length or None for scalars); None when not checkable here."""
    if feat.dtype == "image":
        return None
    base = ARROW_DTYPES.get(feat.dtype)
    if base is None:
        return None
    if feat.shape in ([1], []):
        return base, None
    return base, int(np.prod(feat.shape))


def check_schema(schema: pa.Schema, meta: DatasetMeta, rel: str, episode: int | None, report: Report) -> None:
    features = {k: f for k, f in meta.info.features.items() if f.dtype != "video"}
    for key, feat in features.items():
        if key not in schema.names:
            report.add("schema", f"column missing (info.json declares {feat.dtype}{feat.shape})", rel, episode, key)
            continue
        typ = schema.field(key).type
        if feat.dtype == "image":
            if not (pa.types.is_struct(typ) and typ.get_field_index("bytes") >= 0):
                report.add("schema", f"image column must be struct<bytes, path>, found {typ}", rel, episode, key)
            continue
        expected = _expected_arrow(feat)
        if expected is None:
            continue
        base, n = expected
        if n is None:
            ok = typ == base
            found = str(typ)
        elif pa.types.is_fixed_size_list(typ) or pa.types.is_list(typ) or pa.types.is_large_list(typ):
            ok = typ.value_type == base and (not pa.types.is_fixed_size_list(typ) or typ.list_size == n)
            found = str(typ)
        else:
            ok, found = False, str(typ)
        if not ok:
            report.add("schema", f"info.json declares {feat.dtype}{feat.shape}, parquet has {found}", rel, episode, key)
    for name in schema.names:
        if name not in features and name not in meta.info.features:
            report.add("schema", "column not declared in info.json features", rel, episode, name)


def _list_lengths(col: pa.ChunkedArray) -> np.ndarray | None:
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        return np.concatenate([c.value_lengths().to_numpy(zero_copy_only=False) for c in col.chunks]) \
            if col.num_chunks else np.zeros(0)
    return None


def check_rows(table: pa.Table, meta: DatasetMeta, ep: Episode, rel: str, global_start: int,
               report: Report) -> None:
    """Row-level checks of one episode's rows (index continuity, timestamps, tasks)."""
    e = ep.episode_index
    n = table.num_rows
    if n != ep.length:
        report.add("row_count", f"{n} rows, the episode table says length {ep.length}", rel, e, "length")
    cols = set(table.column_names)
    if "episode_index" in cols:
        bad = np.flatnonzero(table["episode_index"].to_numpy() != e)
        if bad.size:
            report.add("episode_index", f"{bad.size} row(s) carry another episode_index (first at row {bad[0]})",
                       rel, e, "episode_index")
    if "frame_index" in cols:
        fi = table["frame_index"].to_numpy()
        bad = np.flatnonzero(fi != np.arange(n))
        if bad.size:
            report.add("frame_index", f"frame_index is not 0..{n - 1} (first break at row {bad[0]}: {fi[bad[0]]})",
                       rel, e, "frame_index")
    if "index" in cols:
        gi = table["index"].to_numpy()
        bad = np.flatnonzero(gi != np.arange(global_start, global_start + n))
        if bad.size:
            report.add("index", f"global index must run {global_start}..{global_start + n - 1}; row {bad[0]} "
                       f"has {gi[bad[0]]}", rel, e, "index")
    if "timestamp" in cols and n:
        ts = table["timestamp"].to_numpy().astype(np.float64)
        steps = np.diff(ts)
        if (steps <= 0).any():
            r = int(np.flatnonzero(steps <= 0)[0]) + 1
            report.add("timestamp", f"timestamps not strictly increasing at row {r} ({ts[r - 1]} -> {ts[r]})",
                       rel, e, "timestamp")
        else:
            grid = ts[0] + np.arange(n) / meta.info.fps
            off = np.abs(ts - grid)
            if off.max() > TS_TOLERANCE_S:
                r = int(off.argmax())
                report.add("timestamp", f"timestamp {ts[r]:.6f} at row {r} is off the {meta.info.fps} fps grid "
                           f"by {off[r]:.6f}s", rel, e, "timestamp")
    if "task_index" in cols:
        unknown = sorted(set(np.unique(table["task_index"].to_numpy()).tolist()) - set(meta.tasks))
        if unknown:
            report.add("task", f"task_index {unknown} not in the task table", rel, e, "task_index")
    for key, feat in meta.info.features.items():
        if key in cols and feat.dtype not in ("video", "image") and len(feat.shape) == 1 and feat.shape[0] > 1:
            lengths = _list_lengths(table[key])
            if lengths is not None and lengths.size and (lengths != feat.shape[0]).any():
                r = int(np.flatnonzero(lengths != feat.shape[0])[0])
                report.add("schema", f"row {r} has {lengths[r]} values, shape says {feat.shape}", rel, e, key)


def _read_parquet(path: Path, rel: str, report: Report, episode: int | None,
                  columns: Iterable[str] | None = None) -> pa.Table | None:
    try:
        schema = pq.read_schema(path)
        cols = [c for c in dict.fromkeys(columns or schema.names) if c in schema.names]
        return pq.read_table(path, columns=cols).replace_schema_metadata(schema.metadata) \
            if columns else pq.read_table(path)
    except Exception as e:  # corrupt files raise ArrowInvalid, OSError, ...
        report.add("corrupt_file", f"unreadable parquet: {e}", rel, episode)
        return None


ROW_COLUMNS = ("episode_index", "frame_index", "index", "timestamp", "task_index")


# ---------------------------------------------------------------- file inventory
def _inventory(root: Path, sub: str, suffix: str) -> set[str]:
    base = root / sub
    if not base.is_dir():
        return set()
    return {p.relative_to(root).as_posix() for p in base.rglob(f"*{suffix}") if p.is_file()}


_EP_RE = re.compile(r"episode_(\d+)")


def _report_missing_and_extra(expected: Mapping[str, int | None], found: set[str], kind: str,
                              report: Report) -> None:
    missing = {rel: e for rel, e in expected.items() if rel not in found}
    extra = sorted(found - set(expected))
    by_name: dict[str, list[str]] = {}
    for rel in extra:
        by_name.setdefault(Path(rel).name, []).append(rel)
    placed = set()
    for rel, e in sorted(missing.items()):
        elsewhere = [x for x in by_name.get(Path(rel).name, []) if _same_key(rel, x)]
        if elsewhere:
            placed.update(elsewhere)
            report.add("misplaced_file", f"{kind} file expected here is at {elsewhere[0]} (path does not "
                       "match the dataset's path template)", rel, e)
        else:
            report.add("missing_file", f"{kind} file is missing", rel, e)
    for rel in extra:
        if rel not in placed:
            m = _EP_RE.search(rel)
            report.add("extra_file", f"{kind} file not referenced by the metadata", rel,
                       int(m.group(1)) if m else None)


def _same_key(expected_rel: str, found_rel: str) -> bool:
    """A found file is a misplacement of the expected one if it keeps its name and camera key."""
    exp = expected_rel.split("/")
    keys = [p for p in exp[1:-1] if not p.startswith("chunk-")]  # the video key, if any
    return all(k in found_rel.split("/")[:-1] for k in keys)


def _check_v21_files(meta: DatasetMeta, report: Report, deep: bool, workers: int) -> None:
    root = meta.root
    try:
        data_paths = {meta.v21_data_path(ep.episode_index): ep.episode_index for ep in meta.episodes}
        video_paths = {meta.v21_video_path(ep.episode_index, k): ep.episode_index
                       for ep in meta.episodes for k in meta.info.video_keys}
    except (KeyError, IndexError, ValueError) as e:
        report.add("metadata", f"path template cannot be formatted: {e}", layout.INFO_PATH, None, "data_path")
        return
    _report_missing_and_extra(data_paths, _inventory(root, "data", ".parquet"), "data", report)
    if meta.info.video_keys:
        _report_missing_and_extra(video_paths, _inventory(root, "videos", ".mp4"), "video", report)
    starts = np.concatenate([[0], np.cumsum([ep.length for ep in meta.episodes])[:-1]]).astype(int)

    def check_episode(i: int) -> Report:
        sub = Report(root=report.root)
        ep = meta.episodes[i]
        rel = meta.v21_data_path(ep.episode_index)
        if (root / rel).exists():
            table = _read_parquet(root / rel, rel, sub, ep.episode_index)
            if table is not None:
                check_schema(table.schema, meta, rel, ep.episode_index, sub)
                check_rows(table, meta, ep, rel, int(starts[i]), sub)
        for key in meta.info.video_keys:
            vrel = meta.v21_video_path(ep.episode_index, key)
            if (root / vrel).exists():
                _check_video(root / vrel, vrel, meta, key, ep.episode_index, ep.length, None, deep, sub)
        return sub

    with ThreadPoolExecutor(max(1, workers)) as pool:
        for sub in pool.map(check_episode, range(len(meta.episodes))):
            report.defects.extend(sub.defects)


def _check_video(path: Path, rel: str, meta: DatasetMeta, key: str, episode: int | None,
                 num_frames: int | None, min_duration_s: float | None, deep: bool, report: Report) -> None:
    try:
        pr = video.probe(path)
    except Exception as e:
        report.add("corrupt_file", f"unreadable video: {e}", rel, episode, key)
        return
    feat = meta.info.features[key]
    width_first = isinstance(feat.names, list) and feat.names[:2] == ["width", "height"]
    h, w = (feat.shape[1], feat.shape[0]) if width_first else (feat.shape[0], feat.shape[1])
    if (pr.height, pr.width) != (h, w):
        report.add("video", f"resolution {pr.width}x{pr.height}, info.json says {w}x{h}", rel, episode, key)
    declared_fps = (feat.info or {}).get("video.fps", meta.info.fps)
    if abs(pr.fps - float(declared_fps)) > 1e-3 or abs(pr.fps - meta.info.fps) > 1e-3:
        report.add("video", f"{pr.fps:g} fps, metadata says {declared_fps:g} (dataset fps {meta.info.fps:g})",
                   rel, episode, key)
    frames = pr.num_frames
    if deep:
        try:
            frames = video.count_decodable_frames(path)
        except Exception as e:
            report.add("corrupt_file", f"video fails to decode: {e}", rel, episode, key)
            return
    if num_frames is not None and frames != num_frames:
        report.add("video", f"{frames} frames, the episode has {num_frames} rows", rel, episode, key)
    if min_duration_s is not None and pr.duration_s + TS_TOLERANCE_S < min_duration_s:
        report.add("video", f"video lasts {pr.duration_s:.4f}s but episodes reference up to {min_duration_s:.4f}s",
                   rel, episode, key)


def _check_v30_files(meta: DatasetMeta, report: Report, deep: bool, workers: int) -> None:
    from roboloop.datasets.validate_v30 import check_v30_files

    check_v30_files(meta, report, deep, workers)
