"""LeRobot v2.1 -> v3.0 conversion: fast, atomic, never touching the source.

Plan, then execute:
  1. Validate the source; a defective one is refused with the report (nothing written).
  2. Plan output files with LeRobot's greedy rule (start a new file when the running size
     plus the next episode would reach the cap), by uncompressed parquet size for data and
     on-disk size for video, optionally also capped by episode count. Same rule, same
     sizes => the same episode -> (chunk, file) map as LeRobot's converter.
  3. Write every output file as an independent job on a process pool: data files stream
     episode tables into a ParquetWriter (bounded memory), videos are stream-copied.
  4. Write metadata (info, tasks, episodes with per-episode stats + quantiles, stats.json)
     and rename the temporary folder to DST. A killed run leaves only the temporary folder,
     which the next run removes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, Field
from tqdm import tqdm

from roboloop.datasets import layout, stats, video
from roboloop.datasets.meta import DatasetMeta, load_meta
from roboloop.datasets.validate import DatasetDefectError, validate

log = logging.getLogger(__name__)
MB = 1024**2
ROW_GROUP_BYTES = 64 * MB  # flush a row group once this much uncompressed data is buffered


class ConvertConfig(BaseModel):
    data_file_size_in_mb: float = Field(layout.DEFAULT_DATA_FILE_SIZE_IN_MB, gt=0, description="cap per data file")
    video_file_size_in_mb: float = Field(layout.DEFAULT_VIDEO_FILE_SIZE_IN_MB, gt=0, description="cap per mp4")
    max_episodes_per_file: int | None = Field(None, ge=1, description="optional cap on episodes per file")
    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, description="parallel jobs")
    validate_deep: bool = Field(False, description="decode every frame while validating the source")
    progress: bool = Field(True, description="show a progress bar")


def plan_files(sizes_mb: list[float], cap_mb: float, max_episodes: int | None,
               chunks_size: int = layout.DEFAULT_CHUNK_SIZE) -> list[tuple[int, int]]:
    """(chunk_index, file_index) of each episode under LeRobot's greedy size rule."""
    out, chunk, file, acc, n = [], 0, 0, 0.0, 0
    for size in sizes_mb:
        full = acc + size >= cap_mb or (max_episodes is not None and n >= max_episodes)
        if full and n > 0:
            chunk, file = layout.next_chunk_file(chunk, file, chunks_size)
            acc, n = 0.0, 0
        out.append((chunk, file))
        acc += size
        n += 1
    return out


def _uncompressed_mb(path: Path) -> float:
    md = pq.read_metadata(path)
    total = 0
    for rg in range(md.num_row_groups):
        g = md.row_group(rg)
        total += sum(g.column(c).total_uncompressed_size for c in range(g.num_columns))
    return total / MB


def _groups(assign: list[tuple[int, int]]) -> dict[tuple[int, int], list[int]]:
    groups: dict[tuple[int, int], list[int]] = {}
    for ep, cf in enumerate(assign):
        groups.setdefault(cf, []).append(ep)
    return groups


def write_data_file(srcs: list[str], dst: str, schema_bytes: bytes, numeric: list[str]) -> dict[int, dict]:
    """Concatenate episode parquets into `dst`; return exact quantiles of numeric features per episode."""
    schema = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    quantiles: dict[int, dict] = {}
    buf: list[pa.Table] = []
    buffered = 0
    with pq.ParquetWriter(dst, schema, compression="snappy") as writer:
        for src in srcs:
            table = pq.read_table(src)
            table = table.select(schema.names).cast(schema) if table.schema != schema else table
            ep = int(table["episode_index"][0].as_py()) if table.num_rows else -1
            quantiles[ep] = {k: _column_quantiles(table[k]) for k in numeric if k in table.column_names}
            buf.append(table)
            buffered += table.nbytes
            if buffered >= ROW_GROUP_BYTES:
                writer.write_table(pa.concat_tables(buf), row_group_size=1 << 30)
                buf, buffered = [], 0
        if buf:
            writer.write_table(pa.concat_tables(buf), row_group_size=1 << 30)
    return quantiles


def _column_quantiles(col: pa.ChunkedArray) -> dict[str, list]:
    arr = _to_2d(col)
    qs = np.quantile(arr, stats.QUANTILES, axis=0)
    return {k: qs[i].tolist() for i, k in enumerate(stats.QUANTILE_KEYS)}


def _to_2d(col: pa.ChunkedArray) -> np.ndarray:
    col = col.combine_chunks()
    if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) or pa.types.is_large_list(col.type):
        flat = col.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
        return flat.reshape(len(col), -1)
    return col.to_numpy(zero_copy_only=False).astype(np.float64)[:, None]


def write_video_file(srcs: list[str], dst: str) -> list[tuple[float, float]]:
    return video.concat_videos(srcs, dst)


def convert(src: str | Path, dst: str | Path, config: ConvertConfig | None = None) -> Path:
    """Convert the v2.1 dataset at `src` to v3.0 at `dst`. Raises DatasetDefectError on a bad source."""
    cfg = config or ConvertConfig()
    src, dst = Path(src).resolve(), Path(dst).resolve()
    if dst.exists():
        raise FileExistsError(f"{dst} already exists; choose a new destination (the source is never modified)")
    if dst == src or src in dst.parents:
        raise ValueError(f"destination {dst} must be outside the source {src}")
    report = validate(src, deep=cfg.validate_deep, workers=cfg.workers)
    if not report.ok:
        raise DatasetDefectError(report)
    meta = load_meta(src)
    if not meta.is_v21:
        raise ValueError(f"{src} is {meta.version}; convert takes v2.1 datasets")
    dst.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(dst)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.converting-{os.getpid()}-", dir=dst.parent))
    try:
        _convert_into(meta, tmp, cfg)
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def _remove_stale_temps(dst: Path) -> None:
    """Remove temporary folders of earlier, killed conversions to the same DST."""
    for p in dst.parent.glob(f".{dst.name}.converting-*"):
        try:
            pid = int(p.name.split("converting-")[1].split("-")[0])
            os.kill(pid, 0)
            alive = pid != os.getpid()
        except (ValueError, IndexError, ProcessLookupError):
            alive = False
        except PermissionError:
            alive = True
        if not alive:
            shutil.rmtree(p, ignore_errors=True)


def _convert_into(meta: DatasetMeta, out: Path, cfg: ConvertConfig) -> None:
    info = meta.info
    eps = [ep.episode_index for ep in meta.episodes]
    data_src = [meta.root / meta.v21_data_path(e) for e in eps]
    data_assign = plan_files([_uncompressed_mb(p) for p in data_src], cfg.data_file_size_in_mb,
                             cfg.max_episodes_per_file, info.chunks_size)
    video_assign = {
        key: plan_files([(meta.root / meta.v21_video_path(e, key)).stat().st_size / MB for e in eps],
                        cfg.video_file_size_in_mb, cfg.max_episodes_per_file, info.chunks_size)
        for key in sorted(info.video_keys)
    }
    numeric = [k for k, f in info.features.items() if f.dtype not in ("video", "image", "string")]
    schema = _output_schema(data_src[0], meta)
    schema_bytes = schema.serialize().to_pybytes()

    jobs: list[tuple[str, tuple, Callable, tuple]] = []
    for (chunk, file), members in _groups(data_assign).items():
        dst = out / layout.V30_DATA_PATH.format(chunk_index=chunk, file_index=file)
        jobs.append(("data", (chunk, file, members), write_data_file,
                     ([str(data_src[i]) for i in members], str(dst), schema_bytes, numeric)))
    for key, assign in video_assign.items():
        for (chunk, file), members in _groups(assign).items():
            dst = out / layout.V30_VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
            srcs = [str(meta.root / meta.v21_video_path(eps[i], key)) for i in members]
            jobs.append((key, (chunk, file, members), write_video_file, (srcs, str(dst))))
    # Big jobs first so that the pool stays busy to the end.
    jobs.sort(key=lambda j: -len(j[3][0]))
    results = _run_jobs(jobs, cfg)

    ep_quantiles: dict[int, dict] = {}
    video_spans: dict[str, dict[int, tuple[float, float]]] = {k: {} for k in video_assign}
    for (kind, (_, _, members), _, _), res in zip(jobs, results, strict=True):
        if kind == "data":
            ep_quantiles.update(res)
        else:
            for i, span in zip(members, res, strict=True):
                video_spans[kind][i] = span
    _write_meta(meta, out, cfg, data_assign, video_assign, video_spans, ep_quantiles)


def _run_jobs(jobs: list, cfg: ConvertConfig) -> list:
    bar = tqdm(total=len(jobs), desc="convert", unit="file", disable=not cfg.progress)
    Pool = ProcessPoolExecutor if cfg.workers > 1 and len(jobs) > 1 else ThreadPoolExecutor
    try:
        with Pool(max_workers=min(cfg.workers, len(jobs))) as pool:
            futures: list[Future] = [pool.submit(fn, *args) for _, _, fn, args in jobs]
            for f in futures:
                f.add_done_callback(lambda _: bar.update(1))
            return [f.result() for f in futures]
    finally:
        bar.close()


def _output_schema(first_src: Path, meta: DatasetMeta) -> pa.Schema:
    """The source schema (HF metadata kept so `datasets` sees Image/Value types), pandas metadata dropped."""
    schema = pq.read_schema(first_src)
    md = {k: v for k, v in (schema.metadata or {}).items() if k != b"pandas"}
    return schema.with_metadata(md or None)


def _write_meta(meta: DatasetMeta, out: Path, cfg: ConvertConfig, data_assign: list, video_assign: dict,
                video_spans: dict, ep_quantiles: dict) -> None:
    (out / "meta").mkdir(parents=True, exist_ok=True)
    # tasks.parquet: index = task string, column task_index (what LeRobot writes via pandas)
    tasks = pd.DataFrame({"task_index": list(meta.tasks)}, index=pd.Index(list(meta.tasks.values()), name="task"))
    tasks.to_parquet(out / layout.V30_TASKS_PATH)

    rows = []
    start = 0
    for i, ep in enumerate(meta.episodes):
        row: dict = {"episode_index": ep.episode_index,
                     "data/chunk_index": data_assign[i][0], "data/file_index": data_assign[i][1],
                     "dataset_from_index": start, "dataset_to_index": start + ep.length}
        start += ep.length
        for key, assign in video_assign.items():
            f, t = video_spans[key][i]
            row.update({f"videos/{key}/chunk_index": assign[i][0], f"videos/{key}/file_index": assign[i][1],
                        f"videos/{key}/from_timestamp": f, f"videos/{key}/to_timestamp": t})
        row.update({"tasks": ep.tasks, "length": ep.length})
        ep_stats = {k: dict(v) for k, v in meta.episode_stats[ep.episode_index].items()}
        for feat, qs in ep_quantiles.get(ep.episode_index, {}).items():
            ep_stats.setdefault(feat, {}).update({q: np.asarray(v) for q, v in qs.items()})
        for feat, fstats in ep_stats.items():
            for name, value in fstats.items():
                v = np.asarray(value)
                row[f"stats/{feat}/{name}"] = v.astype(np.int64).tolist() if name == "count" else \
                    v.astype(np.float64).tolist()
        row["meta/episodes/chunk_index"] = 0
        row["meta/episodes/file_index"] = 0
        rows.append(row)
    ep_path = out / layout.V30_EPISODES_PATH.format(chunk_index=0, file_index=0)
    ep_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), ep_path)

    legacy = [meta.episode_stats[ep.episode_index] for ep in meta.episodes]
    dataset_stats = stats.aggregate(legacy)
    _add_dataset_quantiles(meta, dataset_stats, data_assign)
    (out / layout.STATS_PATH).write_text(json.dumps(stats.to_jsonable(dataset_stats), indent=4))
    (out / layout.INFO_PATH).write_text(json.dumps(_v30_info(meta, cfg), indent=4))


def _add_dataset_quantiles(meta: DatasetMeta, dataset_stats: dict, data_assign: list) -> None:
    """Exact-to-a-bin dataset quantiles from one streaming pass over the numeric columns."""
    numeric = [k for k, f in meta.info.features.items() if f.dtype not in ("video", "image", "string")
               and k in dataset_stats]
    sketches = {k: stats.QuantileSketch(dataset_stats[k]["min"], dataset_stats[k]["max"]) for k in numeric}
    for ep in meta.episodes:
        table = pq.read_table(meta.root / meta.v21_data_path(ep.episode_index), columns=numeric)
        for k in numeric:
            sketches[k].update(_to_2d(table[k]))
    for k, sk in sketches.items():
        shape = np.asarray(dataset_stats[k]["mean"]).shape
        dataset_stats[k].update({q: v.reshape(shape) for q, v in sk.quantiles().items()})


def _v30_info(meta: DatasetMeta, cfg: ConvertConfig) -> dict:
    src = json.loads((meta.root / layout.INFO_PATH).read_text())  # raw: keeps nulls and unknown keys
    features = {}
    for key, feat in src["features"].items():
        feat = dict(feat)
        if feat["dtype"] != "video":
            feat["fps"] = int(meta.info.fps)
        features[key] = feat
    info = {
        "codebase_version": layout.V30,
        "fps": int(meta.info.fps),
        "features": features,
        "total_episodes": meta.info.total_episodes,
        "total_frames": meta.info.total_frames,
        "total_tasks": meta.info.total_tasks,
        "chunks_size": meta.info.chunks_size,
        "data_files_size_in_mb": _num(cfg.data_file_size_in_mb),
        "video_files_size_in_mb": _num(cfg.video_file_size_in_mb),
        "data_path": layout.V30_DATA_PATH,
        "video_path": layout.V30_VIDEO_PATH if meta.info.video_path is not None else None,
        "robot_type": meta.info.robot_type,
        "splits": meta.info.splits,
    }
    dropped = {"total_chunks", "total_videos", *info}
    info.update({k: v for k, v in src.items() if k not in dropped})
    return info


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x
