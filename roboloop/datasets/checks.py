"""Content checks shared by the v2 and v3 validators: parquet schema, rows, video files.

Strict about what breaks training (a column missing, a vector whose length disagrees with
its declared shape, rows that don't match the episode table, non-finite numbers, a video
with fewer frames than rows) and liberal about what LeRobot itself casts away on load
(float64 where float32 is declared, int32 vs int64): those are warnings.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from roboloop.datasets import video
from roboloop.datasets.arrowutil import np_col, read_table
from roboloop.datasets.meta import DatasetMeta, Episode, Feature
from roboloop.datasets.report import Report

TS_TOLERANCE_S = 1e-4  # LeRobot's own tolerance when matching timestamps to frames
ARROW_DTYPES = {
    "float32": pa.float32(), "float64": pa.float64(), "float16": pa.float16(), "int64": pa.int64(),
    "int32": pa.int32(), "int16": pa.int16(), "int8": pa.int8(), "uint8": pa.uint8(), "uint16": pa.uint16(),
    "uint32": pa.uint32(), "uint64": pa.uint64(), "bool": pa.bool_(), "string": pa.string(),
}
ROW_COLUMNS = ("episode_index", "frame_index", "index", "timestamp", "task_index")


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _expected_arrow(feat: Feature) -> tuple[pa.DataType, int | None] | None:
    """(value type, list length or None for scalars); None when not checkable here."""
    base = ARROW_DTYPES.get(feat.dtype)
    if base is None or feat.dtype == "image":
        return None
    if list(feat.shape) in ([1], []):
        return base, None
    return base, int(np.prod(feat.shape))


def _check_column_type(key: str, feat: Feature, typ: pa.DataType, rel: str, episode: int | None,
                       report: Report) -> None:
    expected = _expected_arrow(feat)
    if expected is None:
        return
    base, n = expected
    if n is None:
        value_type, ok_shape = typ, not _is_list(typ)
    else:
        value_type = typ.value_type if _is_list(typ) else typ
        ok_shape = _is_list(typ) and (not pa.types.is_fixed_size_list(typ) or typ.list_size == n)
    declared = f"{feat.dtype}{list(feat.shape)}"
    if not ok_shape:
        report.add("schema", f"info.json declares {declared}, parquet has {typ}", rel, episode, key)
    elif value_type != base:
        if _is_numeric(value_type) and _is_numeric(base):
            report.warn("dtype", f"parquet stores {value_type} where info.json declares {feat.dtype} (cast on load, "
                        "as LeRobot does)", rel, episode, key)
        else:
            report.add("schema", f"info.json declares {declared}, parquet has {typ}", rel, episode, key)


def check_schema(schema: pa.Schema, meta: DatasetMeta, rel: str, episode: int | None, report: Report) -> None:
    features = {k: f for k, f in meta.info.features.items() if f.dtype != "video"}
    for key, feat in features.items():
        if key not in schema.names:
            report.add("schema", f"column missing (info.json declares {feat.dtype}{list(feat.shape)})", rel, episode,
                       key)
            continue
        typ = schema.field(key).type
        if feat.dtype == "image":
            if not (pa.types.is_struct(typ) and typ.get_field_index("bytes") >= 0):
                report.add("schema", f"image column must be struct<bytes, path>, found {typ}", rel, episode, key)
            continue
        _check_column_type(key, feat, typ, rel, episode, report)
    for name in schema.names:
        if name not in meta.info.features and not name.startswith("__index_level"):
            report.add("schema", "column not declared in info.json features", rel, episode, name)


def _list_lengths(col: pa.ChunkedArray) -> np.ndarray | None:
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        return np.concatenate([np_col(c.value_lengths()) for c in col.chunks]) \
            if col.num_chunks else np.zeros(0)
    return None


def _float_values(col: pa.ChunkedArray) -> np.ndarray | None:
    """The float values of a scalar or list column (flattened), None for other types."""
    typ = col.type
    if _is_list(typ):
        if not pa.types.is_floating(typ.value_type):
            return None
        flat = [c.flatten() for c in col.chunks]
        return np.concatenate([np_col(f) for f in flat]) if flat else np.zeros(0)
    if pa.types.is_floating(typ):
        return np_col(col)
    return None


def _check_index_columns(table: pa.Table, ep: Episode, rel: str, global_start: int, report: Report) -> None:
    e, n, cols = ep.episode_index, table.num_rows, set(table.column_names)
    if "episode_index" in cols:
        bad = np.flatnonzero(np_col(table["episode_index"]) != e)
        if bad.size:
            report.add("episode_index", f"{bad.size} row(s) carry another episode_index (first at row {bad[0]})",
                       rel, e, "episode_index")
    if "frame_index" in cols:
        fi = np_col(table["frame_index"])
        bad = np.flatnonzero(fi != np.arange(n))
        if bad.size:
            report.add("frame_index", f"frame_index is not 0..{n - 1} (first break at row {bad[0]}: {fi[bad[0]]})",
                       rel, e, "frame_index")
    if "index" in cols:
        gi = np_col(table["index"])
        bad = np.flatnonzero(gi != np.arange(global_start, global_start + n))
        if bad.size:
            report.add("index", f"global index must run {global_start}..{global_start + n - 1}; row {bad[0]} "
                       f"has {gi[bad[0]]}", rel, e, "index")


def _check_timestamps(ts: np.ndarray, fps: float, ep: Episode, rel: str, report: Report) -> None:
    e, n = ep.episode_index, len(ts)
    steps = np.diff(ts)
    if (steps <= 0).any():
        r = int(np.flatnonzero(steps <= 0)[0]) + 1
        report.add("timestamp", f"timestamps not strictly increasing at row {r} ({ts[r - 1]} -> {ts[r]})",
                   rel, e, "timestamp")
        return
    grid = ts[0] + np.arange(n) / fps
    off = np.abs(ts - grid)
    if off.max() > TS_TOLERANCE_S:
        r = int(off.argmax())
        report.add("timestamp", f"timestamp {ts[r]:.6f} at row {r} is off the {fps:g} fps grid by {off[r]:.6f}s",
                   rel, e, "timestamp")


def check_rows(table: pa.Table, meta: DatasetMeta, ep: Episode, rel: str, global_start: int,
               report: Report) -> None:
    """Row-level checks of one episode's rows (counts, indices, timestamps, tasks, shapes, finiteness)."""
    e, n, cols = ep.episode_index, table.num_rows, set(table.column_names)
    if n != ep.length:
        report.add("row_count", f"{n} rows, the episode table says length {ep.length}", rel, e, "length")
    _check_index_columns(table, ep, rel, global_start, report)
    if "timestamp" in cols and n:
        _check_timestamps(np_col(table["timestamp"]).astype(np.float64), meta.info.fps, ep, rel, report)
    if "task_index" in cols:
        unknown = sorted(set(np.unique(np_col(table["task_index"])).tolist()) - set(meta.tasks))
        if unknown:
            report.add("task", f"task_index {unknown} not in the task table", rel, e, "task_index")
    for key, feat in meta.info.features.items():
        if key not in cols or feat.dtype in ("video", "image", "string"):
            continue
        if len(feat.shape) == 1 and feat.shape[0] > 1:
            lengths = _list_lengths(table[key])
            if lengths is not None and lengths.size and (lengths != feat.shape[0]).any():
                r = int(np.flatnonzero(lengths != feat.shape[0])[0])
                report.add("schema", f"row {r} has {lengths[r]} values, shape says {feat.shape}", rel, e, key)
                continue
        values = _float_values(table[key])
        if values is not None and values.size and not np.isfinite(values).all():
            bad = np.flatnonzero(~np.isfinite(values))
            width = max(1, values.size // max(1, n))
            r, d = divmod(int(bad[0]), width)
            report.add("non_finite", f"{bad.size} non-finite value(s) (NaN/inf); first at frame {r}, dim {d} "
                       f"({values[bad[0]]})", rel, e, key)


def read_parquet(path: Path, rel: str, report: Report, episode: int | None,
                 columns: Iterable[str] | None = None) -> pa.Table | None:
    """Read a parquet file, or report why it cannot be read (truncated files are named as such)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(max(0, size - 4))
        tail = f.read(4)
    if head != b"PAR1" or tail != b"PAR1":
        what = "the PAR1 footer is missing: the file was cut short" if head == b"PAR1" else "not a parquet file"
        report.add("corrupt_file", f"unreadable parquet ({size} bytes; {what})", rel, episode)
        return None
    try:
        schema = pq.read_schema(path)
        if columns is None:
            return read_table(path)
        cols = [c for c in dict.fromkeys(columns) if c in schema.names]
        return read_table(path, columns=cols).replace_schema_metadata(schema.metadata)
    except Exception as e:  # corrupt pages raise ArrowInvalid, OSError, ...
        report.add("corrupt_file", f"unreadable parquet ({size} bytes): {e}", rel, episode)
        return None


def check_video(path: Path, rel: str, meta: DatasetMeta, key: str, episode: int | None,
                num_frames: int | None, min_duration_s: float | None, deep: bool,
                report: Report) -> video.VideoProbe | None:
    """Resolution, fps and frame count against the metadata; truncation from the packets actually present.
    Returns the file's probe (None when unreadable)."""
    try:
        pr, index = video.scan(path)
    except Exception as e:
        size = path.stat().st_size
        report.add("corrupt_file", f"unreadable video ({size} bytes): {e}; an mp4 cut short loses its index "
                   "(moov box)", rel, episode, key)
        return None
    _check_video_body(path, pr, index, rel, meta, key, episode, num_frames, min_duration_s, deep, report)
    return pr


def check_same_encoding(probes: dict[str, list[tuple[int, str, video.VideoProbe]]], report: Report) -> None:
    """v2.x: each camera's episodes are joined into v3 files by stream copy, which needs one encoder setting per
    camera. Names every episode encoded otherwise than most of them."""
    from collections import Counter

    for key, rows in probes.items():
        common = Counter(pr.encoding for _, _, pr in rows).most_common(1)
        if not common:
            continue
        ref = next(pr for _, _, pr in rows if pr.encoding == common[0][0])
        for ep, rel, pr in rows:
            if pr.encoding != ref.encoding:
                report.add("video", f"encoded with other settings ({pr.describe_encoding()}) than the camera's other "
                           f"episodes ({ref.describe_encoding()}): v3 joins them without re-encoding; re-encode it "
                           "like the others", rel, ep, key)


def _check_video_body(path: Path, pr: video.VideoProbe, index: video.PacketIndex, rel: str, meta: DatasetMeta,
                      key: str, episode: int | None, num_frames: int | None, min_duration_s: float | None,
                      deep: bool, report: Report) -> None:
    feat = meta.info.features[key]
    names = feat.flat_names() or []
    width_first = names[:2] == ["width", "height"]
    h, w = (feat.shape[1], feat.shape[0]) if width_first else (feat.shape[0], feat.shape[1])
    if (pr.height, pr.width) != (h, w):
        report.add("video", f"resolution {pr.width}x{pr.height}, info.json says {w}x{h}", rel, episode, key)
    declared_fps = feat.video_info.get("video.fps", meta.info.fps)
    if abs(pr.fps - float(declared_fps)) > 1e-3 or abs(pr.fps - meta.info.fps) > 1e-3:
        report.add("video", f"{pr.fps:g} fps, metadata says {declared_fps:g} (dataset fps {meta.info.fps:g})",
                   rel, episode, key)
    packets, corrupt = index.count, index.corrupt
    if packets < pr.num_frames or corrupt:
        report.add("corrupt_file", f"truncated video: its index lists {pr.num_frames} frames but only {packets} "
                   f"are in the file ({path.stat().st_size} bytes; cut short?)", rel, episode, key)
        return
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
