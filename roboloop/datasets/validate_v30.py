"""v3.0 file checks: episodes point into shared data/video files by (chunk, file, range)."""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from roboloop.datasets import files, layout
from roboloop.datasets.arrowutil import np_col
from roboloop.datasets.checks import ROW_COLUMNS, TS_TOLERANCE_S, check_rows, check_schema, check_video, read_parquet
from roboloop.datasets.meta import DatasetMeta, Episode
from roboloop.datasets.report import Report, Scan

EPS_DIR = layout.V30_EPISODES_DIR


def check_v30_files(scan: Scan) -> None:
    meta, report = scan.meta, scan.report
    located = _locate(meta, report)
    if located is None:
        return
    data_files, video_files = located
    keys = meta.info.video_keys
    present = files.check_placement(meta.root, {r: None for r in data_files}, scan.files, "data", keys, report,
                                    scan.skip)
    if keys:
        present |= files.check_placement(meta.root, {r: None for r, _ in video_files}, scan.files, "video", keys,
                                         report, scan.skip)
    present -= scan.skip
    with ThreadPoolExecutor(max(1, scan.workers)) as pool:
        subs = list(pool.map(lambda rel: _check_data_file(meta, rel, data_files[rel]),
                             [r for r in data_files if r in present]))
        subs += pool.map(lambda item: _check_video_file(meta, item[0], item[1], scan.deep),
                         [it for it in video_files.items() if it[0][0] in present])
    for sub in subs:
        report.extend(sub)


def _locate(meta: DatasetMeta, report: Report) -> tuple[dict, dict] | None:
    """Check the episode table's locations; map each data/video file to the episodes stored in it."""
    info = meta.info
    data_files: dict[str, list[Episode]] = defaultdict(list)
    video_files: dict[tuple[str, str], list[Episode]] = defaultdict(list)
    expected_start = 0
    for ep in meta.episodes:
        e = ep.episode_index
        if None in (ep.data_chunk_index, ep.data_file_index, ep.dataset_from_index, ep.dataset_to_index):
            report.add("metadata", "missing data location (data/chunk_index, data/file_index, dataset_*_index)",
                       EPS_DIR, e, "data/chunk_index")
            continue
        assert ep.dataset_from_index is not None and ep.dataset_to_index is not None
        if ep.dataset_from_index != expected_start:
            report.add("index", f"dataset_from_index {ep.dataset_from_index}, expected {expected_start} "
                       "(ranges must be contiguous)", EPS_DIR, e, "dataset_from_index")
        if ep.dataset_to_index - ep.dataset_from_index != ep.length:
            report.add("row_count", f"index range {ep.dataset_from_index}..{ep.dataset_to_index} does not match "
                       f"length {ep.length}", EPS_DIR, e, "dataset_to_index")
        expected_start = ep.dataset_to_index
        try:
            rel = layout.check_relative(info.data_path.format(
                chunk_index=ep.data_chunk_index, file_index=ep.data_file_index)).as_posix()
            vrels = {key: layout.check_relative(info.video_path.format(  # type: ignore[union-attr]
                video_key=key, chunk_index=int(loc["chunk_index"]), file_index=int(loc["file_index"]))).as_posix()
                for key, loc in ep.videos.items() if key in info.video_keys}
        except (KeyError, ValueError, AttributeError) as err:
            report.add("unsafe_path" if isinstance(err, layout.UnsafePathError) else "metadata", str(err),
                       layout.INFO_PATH, e, "data_path")
            return None
        data_files[rel].append(ep)
        for key in info.video_keys:
            if key not in vrels:
                report.add("metadata", "no video location for this camera", EPS_DIR, e, f"videos/{key}")
                continue
            video_files[(vrels[key], key)].append(ep)
            loc = ep.videos[key]
            span = loc["to_timestamp"] - loc["from_timestamp"]
            if abs(span - ep.length / info.fps) > 1.0 / info.fps + TS_TOLERANCE_S:
                report.add("timestamp", f"video span {span:.4f}s does not match {ep.length} frames at "
                           f"{info.fps:g} fps", EPS_DIR, e, f"videos/{key}/to_timestamp")
    return data_files, video_files


def _check_data_file(meta: DatasetMeta, rel: str, eps: list[Episode]) -> Report:
    sub = Report(root=str(meta.root))
    table = read_parquet(meta.root / rel, rel, sub, None, columns=[*ROW_COLUMNS, *meta.info.features])
    if table is None:
        return sub
    check_schema(table.schema, meta, rel, None, sub)
    if "index" not in table.column_names:
        return sub
    gidx = np_col(table["index"])
    for ep in eps:
        assert ep.dataset_from_index is not None
        lo = np.searchsorted(gidx, ep.dataset_from_index)
        check_rows(table.slice(int(lo), ep.length), meta, ep, rel, ep.dataset_from_index, sub)
    return sub


def _check_video_file(meta: DatasetMeta, vkey: tuple[str, str], eps: list[Episode], deep: bool) -> Report:
    (vrel, key), sub = vkey, Report(root=str(meta.root))
    end = max(ep.videos[key]["to_timestamp"] for ep in eps)
    contiguous = all(abs(a.videos[key]["to_timestamp"] - b.videos[key]["from_timestamp"]) < TS_TOLERANCE_S
                     for a, b in zip(eps, eps[1:], strict=False))
    total = sum(ep.length for ep in eps) if contiguous and eps[0].videos[key]["from_timestamp"] == 0 else None
    check_video(meta.root / vrel, vrel, meta, key, eps[0].episode_index if len(eps) == 1 else None, total, end,
                deep, sub)
    return sub
