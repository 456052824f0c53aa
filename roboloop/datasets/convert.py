"""LeRobot v2.x -> v3.0 conversion: fast, atomic, never touching the source.

Plan, then execute:
  1. Validate the source; a defective one is refused with the report (nothing written).
     Per-episode stats the source lacks (v2.0, or a v2.1 that lost episodes_stats.jsonl) are
     computed from its data.
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

import contextlib
import json
import logging
import multiprocessing
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pyarrow imports it lazily for list columns: once here, before the
import pyarrow.parquet as pq  # workers fork, instead of ~0.1 s in each of them)
from tqdm import tqdm

from roboloop import fsutil, hashing, procs
from roboloop.datasets import episode_stats, layout, stats, video
from roboloop.datasets.arrowutil import read_table, rows_table, tasks_table, to_2d
from roboloop.datasets.config import ConvertConfig
from roboloop.datasets.meta import DatasetMeta, load_meta
from roboloop.datasets.validate import DatasetDefectError, validate

log = logging.getLogger(__name__)
MB = 1024**2
ROW_GROUP_BYTES = 64 * MB  # flush a row group once this much uncompressed data is buffered


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


def write_data_file(srcs: list[str], dst: str, schema_bytes: bytes, numeric: list[str],
                    bounds: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[dict[int, dict], dict[str, np.ndarray]]:
    """Concatenate episode parquets into `dst`; return exact quantiles of numeric features per episode, and the
    counts of each feature's dataset-quantile sketch between `bounds` (min, max) over this file's rows."""
    schema = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    quantiles: dict[int, dict] = {}
    sketches = {k: stats.QuantileSketch(*bounds[k]) for k in numeric if k in bounds}
    buf: list[pa.Table] = []
    buffered = 0
    with pq.ParquetWriter(dst, schema, compression="snappy") as writer:
        for src in srcs:
            table = read_table(src)
            table = table.select(schema.names).cast(schema) if table.schema != schema else table
            ep = int(table["episode_index"][0].as_py()) if table.num_rows else -1
            cols = {k: to_2d(table[k]) for k in numeric if k in table.column_names}
            quantiles[ep] = _quantiles(cols)
            for k, sk in sketches.items():
                if k in cols:
                    sk.update(cols[k])
            buf.append(table)
            buffered += table.nbytes
            if buffered >= ROW_GROUP_BYTES:
                writer.write_table(pa.concat_tables(buf), row_group_size=1 << 30)
                buf, buffered = [], 0
        if buf:
            writer.write_table(pa.concat_tables(buf), row_group_size=1 << 30)
    return quantiles, {k: sk.counts for k, sk in sketches.items()}


def _quantiles(cols: dict[str, np.ndarray]) -> dict[str, dict[str, list]]:
    """Exact quantiles of each (N, D) column, from one `np.quantile` over them side by side (column-wise, so the
    same numbers as one call per column; a call per column cost a fifth of a data file's job)."""
    if not cols or not len(next(iter(cols.values()))):
        return {k: _column_quantiles(v) for k, v in cols.items()}
    qs = np.quantile(np.hstack(list(cols.values())), stats.QUANTILES, axis=0)
    out, at = {}, 0
    for k, v in cols.items():
        part = qs[:, at:at + v.shape[1]]
        out[k] = {name: part[i].tolist() for i, name in enumerate(stats.QUANTILE_KEYS)}
        at += v.shape[1]
    return out


def _column_quantiles(arr: np.ndarray) -> dict[str, list]:
    qs = np.quantile(arr, stats.QUANTILES, axis=0)
    return {k: qs[i].tolist() for i, k in enumerate(stats.QUANTILE_KEYS)}


def write_video_file(srcs: list[str], dst: str) -> list[tuple[float, float]]:
    return video.concat_videos(srcs, dst)


class ConversionCheckError(ValueError):
    """The converted output failed its own validation: it was not published."""


def check_source(src: Path, dst: Path, cfg: ConvertConfig, overwrite: bool = False, validated: bool = False):
    """Everything that must hold before a conversion writes anything: a readable v2.x source without defects and
    a destination roboloop may write. Returns the source's metadata; raises naming the defect. `validated`: the
    caller has just run `validate_source` (the CLI runs it beside hashing the source for the receipt)."""
    _require_folder(src)
    if fsutil.inside(dst, src) or fsutil.inside(src, dst):
        raise ValueError(f"destination {dst} must be outside the source {src} (and must not contain it)")
    fsutil.check_destination(dst, "dataset_v3", overwrite, flag="DST")
    return _v2_meta(src) if validated else validate_source(src, cfg)


def validate_source(src: Path, cfg: ConvertConfig):
    """The source alone: a v2.x dataset without defects (DatasetDefectError with the report otherwise)."""
    _require_folder(src)
    report = validate(src, deep=cfg.validate_deep, workers=cfg.num_workers)
    if not report.ok:
        raise DatasetDefectError(report)
    return _v2_meta(src)


def _require_folder(src: Path) -> None:
    if not src.is_dir():
        raise FileNotFoundError(f"{src} is not a dataset folder" if src.exists() else f"{src} does not exist")


def _v2_meta(src: Path) -> DatasetMeta:
    meta = load_meta(src)
    if not meta.is_v2:
        raise ValueError(f"{src} is {meta.version}; convert takes v2.0/v2.1 datasets (v3.0 needs no conversion)")
    return meta


def convert(src: str | Path, dst: str | Path, config: ConvertConfig | None = None, overwrite: bool = False,
            marker: dict | Callable[[], dict] | None = None, validated: bool | Future = False) -> Path:
    """Convert the v2.x dataset at `src` to v3.0 at `dst`. Raises DatasetDefectError on a bad source.

    `dst` must not exist, unless it is an earlier roboloop conversion and `overwrite` is set (the old
    one is moved aside). `marker`: what roboloop's marker in `dst` records (a callable: asked at the end). The
    output is validated and checked (`check_output`) before it is renamed into place: a conversion we would
    refuse to read is never published. `validated`: `validate_source` has just passed, or
    is running (a Future: the CLI validates while the source is hashed and converted); then its verdict gates the
    output check and the rename, and a defect it finds is what this raises, whatever the conversion ran into.
    """
    cfg = config or ConvertConfig()
    src, dst = Path(src).resolve(), Path(dst).absolute()
    verdict = validated if isinstance(validated, Future) else None
    with _source_defects_first(verdict):
        meta = check_source(src, dst, cfg, overwrite, bool(validated))
    dst.parent.mkdir(parents=True, exist_ok=True)
    with fsutil.exclusive(fsutil.lock_path_for(dst), f"conversion to {dst}"), \
            fsutil.atomic_dir(dst, "dataset_v3", overwrite, meta=lambda: {
                "format": layout.V30, **((marker() if callable(marker) else marker) or {})}) as tmp:
        with _source_defects_first(verdict):
            _convert_into(meta, tmp, cfg)
        if verdict is not None:
            verdict.result()  # a defective source raises its report here: the temporary folder goes, nothing else
        with ThreadPoolExecutor(1) as pool:
            # inside `hashing.remembering()` (a stage that hashes its output for the receipt), the output's md5s
            # are taken on a second core while it is checked, and not read again after the rename
            hashed = pool.submit(hashing.dir_entries, tmp) if hashing.remembering_now() else None
            check_output(tmp, cfg.num_workers)
            if hashed is not None:
                hashed.result()
    return dst


@contextlib.contextmanager
def _source_defects_first(verdict: Future | None) -> Iterator[None]:
    """A conversion of a source still being validated may fail on its defects: report the defects, not that."""
    try:
        yield
    except Exception:
        if verdict is not None:
            verdict.result()
        raise


def check_output(root: Path, workers: int = 1) -> None:
    """Never publish what we would refuse to read: validate, then check from the packets (one demux pass per file,
    shared with the validation) that every episode starts on a keyframe at the time the metadata gives and that
    its last frame's packet is where the metadata says, and decode each file's first frame. Packets are
    stream-copied, never re-encoded, so a frame that is present decodes as it did in the (validated) source;
    decoding each episode's first frame cost a seek and a decode per episode (a fifth of a conversion)."""
    report = validate(root, workers=workers)
    if not report.ok:
        raise ConversionCheckError("the converted dataset failed validation; nothing was published:\n"
                                   + report.human(limit=20))
    meta = load_meta(root)
    tol = 0.5 / meta.info.fps
    wanted: dict[Path, tuple[list[float], list[float]]] = {}
    for ep in meta.episodes:
        for key, loc in ep.videos.items():
            path = root / meta.info.video_path.format(  # type: ignore[union-attr]
                video_key=key, chunk_index=int(loc["chunk_index"]), file_index=int(loc["file_index"]))
            first = float(loc["from_timestamp"])
            firsts, lasts = wanted.setdefault(path, ([], []))
            firsts.append(first)
            lasts.append(first + (ep.length - 1) / meta.info.fps)

    def check(item: tuple[Path, tuple[list[float], list[float]]]) -> None:
        path, (firsts, lasts) = item
        try:
            _check_episode_packets(path, firsts, lasts, tol)
        except Exception as e:
            raise ConversionCheckError(f"the converted video {path.relative_to(root)} does not hold an episode's "
                                       f"first/last frame ({e}); nothing was published") from e

    with ThreadPoolExecutor(max(1, workers)) as pool:  # PyAV decodes with the GIL released
        list(pool.map(check, wanted.items()))


def _check_episode_packets(path: Path, firsts: list[float], lasts: list[float], tol: float) -> None:
    """Each episode starts on a keyframe at its first time and has a packet at its last; the file's first frame
    decodes. Raises ValueError naming the first time that fails."""
    import bisect

    def near(times: tuple[float, ...], t: float) -> bool:
        i = bisect.bisect_left(times, t - tol)
        return i < len(times) and abs(times[i] - t) <= tol

    index = video.packet_index(path)
    for t in firsts:
        if not near(index.keyframe_times, t):
            raise ValueError(f"no keyframe at t={t:.6f}s, where an episode starts")
    for t in lasts:
        if not near(index.times, t):
            raise ValueError(f"no frame at t={t:.6f}s")
    video.check_decodes_at(path, [min(firsts)], tolerance_s=tol)


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
    ep_stats = episode_stats.fill_missing(meta, cfg.num_workers)
    dataset_stats = stats.aggregate([ep_stats[e] for e in eps])
    # the data jobs also fill each feature's dataset-quantile sketch between its (exact) min and max
    bounds = {k: (dataset_stats[k]["min"], dataset_stats[k]["max"]) for k in numeric if k in dataset_stats}
    schema = _output_schema(data_src[0], meta)
    schema_bytes = schema.serialize().to_pybytes()

    jobs: list[tuple[str, tuple, Callable, tuple]] = []
    for (chunk, file), members in _groups(data_assign).items():
        dst = out / layout.V30_DATA_PATH.format(chunk_index=chunk, file_index=file)
        jobs.append(("data", (chunk, file, members), write_data_file,
                     ([str(data_src[i]) for i in members], str(dst), schema_bytes, numeric, bounds)))
    for key, assign in video_assign.items():
        for (chunk, file), members in _groups(assign).items():
            dst = out / layout.V30_VIDEO_PATH.format(video_key=key, chunk_index=chunk, file_index=file)
            srcs = [str(meta.root / meta.v21_video_path(eps[i], key)) for i in members]
            jobs.append((key, (chunk, file, members), write_video_file, (srcs, str(dst))))
    # Big jobs first so that the pool stays busy to the end.
    jobs.sort(key=lambda j: -len(j[3][0]))
    results = _run_jobs(jobs, cfg)

    ep_quantiles: dict[int, dict] = {}
    sketches = {k: stats.QuantileSketch(*b) for k, b in bounds.items()}
    video_spans: dict[str, dict[int, tuple[float, float]]] = {k: {} for k in video_assign}
    for (kind, (_, _, members), _, _), res in zip(jobs, results, strict=True):
        if kind == "data":
            ep_quantiles.update(res[0])
            for k, counts in res[1].items():
                sketches[k].counts += counts
        else:
            for i, span in zip(members, res, strict=True):
                video_spans[kind][i] = span
    for k, sk in sketches.items():  # exact to a bin: one streaming pass over every row, in the data jobs
        shape = np.asarray(dataset_stats[k]["mean"]).shape
        dataset_stats[k].update({q: v.reshape(shape) for q, v in sk.quantiles().items()})
    _write_meta(meta, out, cfg, data_assign, video_assign, video_spans, ep_quantiles, ep_stats, dataset_stats)


_FORKED: ProcessPoolExecutor | None = None


@contextlib.contextmanager
def workers_forked_now(workers: int) -> Iterator[None]:
    """Fork the conversion's worker processes now, while this process has one thread, for the conversions run
    inside the block. A process forked while another thread is importing a module inherits that module's import
    lock held forever: the worker hangs at its first import (seen: the CLI hashing and validating the source on
    threads while it converts). Without this block, a conversion in a process with threads starts its workers
    from a fork server."""
    global _FORKED
    if workers <= 1 or threading.active_count() > 1 or _FORKED is not None:
        yield
        return
    pool = _fork_pool(workers)
    pool.submit(int).result()  # a fork-context pool starts all its workers at its first task
    _FORKED = pool
    try:
        yield
    finally:
        _FORKED = None
        pool.shutdown(cancel_futures=True)


def _worker_pool(workers: int) -> contextlib.AbstractContextManager[Executor]:
    if workers <= 1:
        return ThreadPoolExecutor(1)
    if _FORKED is not None:
        return contextlib.nullcontext(_FORKED)
    if threading.active_count() == 1:
        return _fork_pool(workers)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])  # (takes effect when the server starts: once per process)
    return ProcessPoolExecutor(workers, mp_context=ctx, initializer=procs.die_with_parent)


def _fork_pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=procs.die_with_parent)


def _run_jobs(jobs: list, cfg: ConvertConfig) -> list:
    pool_cm = _worker_pool(min(cfg.num_workers, len(jobs)))  # before the bar's monitor thread
    bar = tqdm(total=len(jobs), desc="convert", unit="file", disable=not cfg.progress)
    try:
        with pool_cm as pool:
            futures: list[Future] = []
            try:  # submitting too: a SIGTERM while jobs are queued must not leave the queued ones running
                for _, _, fn, args in jobs:
                    futures.append(pool.submit(fn, *args))
                    futures[-1].add_done_callback(lambda _: bar.update(1))
                return [f.result() for f in futures]
            except BaseException:  # (a failed job, SIGTERM): no job may still write once the caller cleans up
                for f in futures:
                    f.cancel()
                wait(futures)
                raise
    finally:
        bar.close()


def _output_schema(first_src: Path, meta: DatasetMeta) -> pa.Schema:
    """The source schema (HF metadata kept so `datasets` sees Image/Value types), pandas metadata dropped."""
    schema = pq.read_schema(first_src)
    md = {k: v for k, v in (schema.metadata or {}).items() if k != b"pandas"}
    return schema.with_metadata(md or None)


def _write_meta(meta: DatasetMeta, out: Path, cfg: ConvertConfig, data_assign: list, video_assign: dict,
                video_spans: dict, ep_quantiles: dict, ep_stats_all: dict, dataset_stats: dict) -> None:
    (out / "meta").mkdir(parents=True, exist_ok=True)
    pq.write_table(tasks_table(meta.tasks), out / layout.V30_TASKS_PATH)  # index = task string, as pandas writes

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
        ep_stats = {k: dict(v) for k, v in ep_stats_all[ep.episode_index].items()}
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
    pq.write_table(rows_table(rows), ep_path)  # what pa.Table.from_pylist(rows) gives, without pandas

    (out / layout.STATS_PATH).write_text(json.dumps(stats.to_jsonable(dataset_stats), indent=4))
    (out / layout.INFO_PATH).write_text(json.dumps(_v30_info(meta, cfg), indent=4))


def _v30_info(meta: DatasetMeta, cfg: ConvertConfig) -> dict:
    src = json.loads((meta.root / layout.INFO_PATH).read_text())  # raw: keeps nulls and unknown keys
    features = {}
    for key, feat in src["features"].items():
        feat = dict(feat)
        if feat["dtype"] != "video":
            feat["fps"] = _num(src["fps"])  # exactly as given: 29.97 stays 29.97 (LeRobot's converter truncates it)
        features[key] = feat
    info = {
        "codebase_version": layout.V30,
        "fps": _num(src["fps"]),
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
