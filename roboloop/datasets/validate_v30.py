"""v3.0 file checks: episodes point into shared data/video files by (chunk, file, range)."""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from roboloop.datasets import layout
from roboloop.datasets.meta import DatasetMeta
from roboloop.datasets.validate import (
    ROW_COLUMNS,
    TS_TOLERANCE_S,
    Report,
    _check_video,
    _inventory,
    _read_parquet,
    _report_missing_and_extra,
    check_rows,
    check_schema,
)


def check_v30_files(meta: DatasetMeta, report: Report, deep: bool, workers: int) -> None:
    root, info = meta.root, meta.info
    eps_dir = layout.V30_EPISODES_DIR
    data_files: dict[str, list] = defaultdict(list)
    video_files: dict[tuple[str, str], list] = defaultdict(list)
    expected_start = 0
    for ep in meta.episodes:
        e = ep.episode_index
        if None in (ep.data_chunk_index, ep.data_file_index, ep.dataset_from_index, ep.dataset_to_index):
            report.add("metadata", "missing data location (data/chunk_index, data/file_index, dataset_*_index)",
                       eps_dir, e, "data/chunk_index")
            continue
        assert ep.dataset_from_index is not None and ep.dataset_to_index is not None
        if ep.dataset_from_index != expected_start:
            report.add("index", f"dataset_from_index {ep.dataset_from_index}, expected {expected_start} "
                       "(ranges must be contiguous)", eps_dir, e, "dataset_from_index")
        if ep.dataset_to_index - ep.dataset_from_index != ep.length:
            report.add("row_count", f"index range {ep.dataset_from_index}..{ep.dataset_to_index} does not match "
                       f"length {ep.length}", eps_dir, e, "dataset_to_index")
        expected_start = ep.dataset_to_index
        try:
            rel = layout.check_relative(info.data_path.format(
                chunk_index=ep.data_chunk_index, file_index=ep.data_file_index)).as_posix()
        except (KeyError, ValueError) as err:
            report.add("unsafe_path" if isinstance(err, layout.UnsafePathError) else "metadata", str(err),
                       layout.INFO_PATH, e, "data_path")
            return
        data_files[rel].append(ep)
        for key in info.video_keys:
            loc = ep.videos.get(key)
            if loc is None:
                report.add("metadata", "no video location for this camera", eps_dir, e, f"videos/{key}")
                continue
            vrel = info.video_path.format(  # type: ignore[union-attr]
                video_key=key, chunk_index=int(loc["chunk_index"]), file_index=int(loc["file_index"]))
            video_files[(vrel, key)].append(ep)
            span = loc["to_timestamp"] - loc["from_timestamp"]
            if abs(span - ep.length / info.fps) > 1.0 / info.fps + TS_TOLERANCE_S:
                report.add("timestamp", f"video span {span:.4f}s does not match {ep.length} frames at "
                           f"{info.fps:g} fps", eps_dir, e, f"videos/{key}/to_timestamp")
    _report_missing_and_extra({r: None for r in data_files}, _inventory(root, "data", ".parquet"), "data", report)
    if info.video_keys:
        _report_missing_and_extra({r: None for r, _ in video_files}, _inventory(root, "videos", ".mp4"),
                                  "video", report)

    def check_data_file(rel: str) -> Report:
        sub = Report(root=report.root)
        if not (root / rel).exists():
            return sub
        table = _read_parquet(root / rel, rel, sub, None, columns=[*ROW_COLUMNS, *info.features])
        if table is None:
            return sub
        check_schema(table.schema, meta, rel, None, sub)
        if "index" not in table.column_names:
            return sub
        gidx = table["index"].to_numpy()
        for ep in data_files[rel]:
            assert ep.dataset_from_index is not None
            lo = np.searchsorted(gidx, ep.dataset_from_index)
            rows = table.slice(int(lo), ep.length)
            check_rows(rows, meta, ep, rel, ep.dataset_from_index, sub)
        return sub

    def check_video_file(item: tuple[tuple[str, str], list]) -> Report:
        (vrel, key), eps = item
        sub = Report(root=report.root)
        if (root / vrel).exists():
            end = max(ep.videos[key]["to_timestamp"] for ep in eps)
            contiguous = all(
                abs(a.videos[key]["to_timestamp"] - b.videos[key]["from_timestamp"]) < TS_TOLERANCE_S
                for a, b in zip(eps, eps[1:], strict=False))
            total = sum(ep.length for ep in eps) if contiguous and eps[0].videos[key]["from_timestamp"] == 0 \
                else None
            _check_video(root / vrel, vrel, meta, key, eps[0].episode_index if len(eps) == 1 else None,
                         total, end, deep, sub)
        return sub

    with ThreadPoolExecutor(max(1, workers)) as pool:
        for sub in pool.map(check_data_file, list(data_files)):
            report.defects.extend(sub.defects)
        for sub in pool.map(check_video_file, list(video_files.items())):
            report.defects.extend(sub.defects)
