"""v2.0/v2.1 file checks: one parquet per episode, one mp4 per episode and camera."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from roboloop.datasets import files, layout
from roboloop.datasets.checks import check_rows, check_same_encoding, check_schema, check_video, read_parquet
from roboloop.datasets.report import Report, Scan


def _expected_paths(meta, report: Report) -> tuple[dict[str, int], dict[str, int]] | None:
    """(data, video) relative paths the templates give, each with its episode; None (reported) if they cannot."""
    try:
        data_paths = {layout.check_relative(meta.v21_data_path(ep.episode_index)).as_posix(): ep.episode_index
                      for ep in meta.episodes}
        video_paths = {layout.check_relative(meta.v21_video_path(ep.episode_index, k)).as_posix(): ep.episode_index
                       for ep in meta.episodes for k in meta.info.video_keys}
    except layout.UnsafePathError as e:
        report.add("unsafe_path", str(e), layout.INFO_PATH, None, "data_path")
        return None
    except (KeyError, IndexError, ValueError) as e:
        report.add("metadata", f"path template cannot be formatted: {e}", layout.INFO_PATH, None, "data_path")
        return None
    return data_paths, video_paths


def check_v2_files(scan: Scan) -> None:
    meta, report = scan.meta, scan.report
    root = meta.root
    paths = _expected_paths(meta, report)
    if paths is None:
        return
    data_paths, video_paths = paths
    keys = meta.info.video_keys
    present = files.check_placement(root, data_paths, scan.files, "data", keys, report, scan.skip)
    if keys:
        present |= files.check_placement(root, video_paths, scan.files, "video", keys, report, scan.skip)
    present -= scan.skip
    starts = np.concatenate([[0], np.cumsum([ep.length for ep in meta.episodes])[:-1]]).astype(int)

    probes: dict[str, list] = {k: [] for k in keys}

    def check_episode(i: int) -> Report:
        sub = Report(root=report.root)
        ep = meta.episodes[i]
        rel = meta.v21_data_path(ep.episode_index)
        if rel in present:
            table = read_parquet(root / rel, rel, sub, ep.episode_index)
            if table is not None:
                check_schema(table.schema, meta, rel, ep.episode_index, sub)
                check_rows(table, meta, ep, rel, int(starts[i]), sub)
        for key in keys:
            vrel = meta.v21_video_path(ep.episode_index, key)
            if vrel in present:
                pr = check_video(root / vrel, vrel, meta, key, ep.episode_index, ep.length, None, scan.deep, sub)
                if pr is not None:
                    probes[key].append((ep.episode_index, vrel, pr))
        return sub

    with ThreadPoolExecutor(max(1, scan.workers)) as pool:
        for sub in pool.map(check_episode, range(len(meta.episodes))):
            report.extend(sub)
    check_same_encoding({k: sorted(v, key=lambda r: r[0]) for k, v in probes.items()}, report)
