"""Find every defect of a LeRobot dataset (v2.0, v2.1 or v3.0) and say exactly where it is.

Each `Defect` names a code (the defect class), the file, the episode and the field. The
checks: Git LFS pointers where content should be (reported once, with the fix); metadata
readable and typed; paths that would escape the root (refused outright); missing, extra and
misplaced data/video files, looked for across the whole dataset root (a misplaced file is
reported with where it actually is, and one cause for many files is one line); row counts
against info.json and the episode table; episode and global index continuity; timestamps
monotonic and on the fps grid; feature dtype/shape against the parquet schema; non-finite
numbers; video frame count (from the packets actually present, so truncated files are
caught), fps and resolution against the metadata; task indices that don't resolve; missing
stats. `deep=True` also decodes every video frame.

Quirks LeRobot accepts are warnings, not defects (see `report`).
"""

from __future__ import annotations

from pathlib import Path

from roboloop.datasets import files, layout
from roboloop.datasets.meta import DatasetMeta, MetadataError, load_meta
from roboloop.datasets.report import DatasetDefectError, Defect, Report, Scan

__all__ = ["DatasetDefectError", "Defect", "Report", "validate"]


def validate(root: str | Path, deep: bool = False, workers: int = 8) -> Report:
    root = Path(root)
    report = Report(root=str(root))
    if not root.exists():
        report.add("metadata", "dataset folder does not exist", str(root))
        return report
    if not root.is_dir():
        report.add("metadata", "is a file, not a dataset folder (a folder with meta/info.json)", str(root))
        return report
    found = files.inventory(root)
    escaping = files.scan_symlinks(root, report)
    if any(rel.startswith("meta/") or rel == "meta" for rel in escaping):
        return report  # metadata read through a link out of the dataset: refused before reading it
    pointers = files.scan_lfs_pointers(root, found, report) | escaping
    if layout.INFO_PATH in pointers:
        return report  # nothing can be read: the one defect says why and how to fix it
    try:
        meta = load_meta(root)
    except MetadataError as e:
        if not (pointers and "LFS" in str(e)):
            code = "unsafe_path" if "escapes" in str(e) or "absolute path" in str(e) else "metadata"
            report.add(code, str(e).split(": ", 1)[-1], file=e.file, episode=e.episode, field=e.field)
        return report
    report.version = meta.version
    report.num_episodes = len(meta.episodes)
    report.num_frames = sum(ep.length for ep in meta.episodes)
    _check_info(meta, report)
    _check_episode_table(meta, report)
    _check_tasks_and_stats(meta, report)
    scan = Scan(meta, report, deep, workers, found, pointers)
    if meta.is_v2:
        from roboloop.datasets.validate_v2 import check_v2_files

        check_v2_files(scan)
    else:
        from roboloop.datasets.validate_v30 import check_v30_files

        check_v30_files(scan)
    report.coalesce(files.GROUP_OVER)
    return report


def _eps_file(meta: DatasetMeta) -> str:
    return layout.V21_EPISODES_PATH if meta.is_v2 else layout.V30_EPISODES_DIR


def _check_info(meta: DatasetMeta, report: Report) -> None:
    info = meta.info
    if info.splits:
        for split, spec in info.splits.items():
            lo, _, hi = str(spec).partition(":")
            if lo.isdigit() and hi.isdigit() and int(hi) > info.total_episodes:
                report.warn("splits", f"split {split!r} = {spec!r} reaches past total_episodes "
                            f"{info.total_episodes} (ignored: roboloop uses every episode)", layout.INFO_PATH,
                            None, "splits")
            elif lo.isdigit() and hi.isdigit() and split == "train" and len(info.splits) == 1 \
                    and int(hi) != info.total_episodes:
                report.warn("splits", f"split {split!r} = {spec!r} disagrees with total_episodes "
                            f"{info.total_episodes} (ignored: roboloop uses every episode)", layout.INFO_PATH,
                            None, "splits")
    if meta.version == layout.V20:
        report.warn("version", "v2.0 dataset: per-episode stats are computed from the data at conversion "
                    "(LeRobot 0.6's converter takes only v2.1)", layout.INFO_PATH, None, "codebase_version")
    if info.video_keys and info.video_path is None:
        report.add("metadata", f"video features {info.video_keys} but no video_path template", layout.INFO_PATH,
                   None, "video_path")


def _check_episode_table(meta: DatasetMeta, report: Report) -> None:
    info = meta.info
    eps_file = _eps_file(meta)
    indices = [ep.episode_index for ep in meta.episodes]
    seen: set[int] = set()
    for i in sorted({i for i in indices if indices.count(i) > 1}):
        report.add("episode_index", "episode listed more than once", eps_file, i, "episode_index")
    seen = set(indices)
    expected = set(range(len(seen)))
    for i in sorted(seen - expected):
        report.add("episode_index", f"episode indices must be 0..{len(expected) - 1} without gaps",
                   eps_file, i, "episode_index")
    for i in sorted(expected - seen):
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


STAT_NAMES = ("min", "max", "mean", "std", "count")


def _check_tasks_and_stats(meta: DatasetMeta, report: Report) -> None:
    task_strings = set(meta.tasks.values())
    tasks_file = layout.V21_TASKS_PATH if meta.is_v2 else layout.V30_TASKS_PATH
    eps_file = _eps_file(meta)
    for ep in meta.episodes:
        for t in ep.tasks:
            if t not in task_strings:
                report.add("task", f"task {t!r} is not in {tasks_file}", eps_file, ep.episode_index, "tasks")
    stat_feats = [k for k, f in meta.info.features.items() if f.dtype not in ("string", "language")]
    if meta.is_v2:
        _check_v2_stats(meta, report, stat_feats)
        return
    if meta.stats is None:
        report.warn("stats", "dataset stats file is missing (aggregated from the per-episode stats on load)",
                    layout.STATS_PATH)
    for ep in meta.episodes:
        ep_stats = meta.episode_stats.get(ep.episode_index)
        missing = [f"{feat}/{s}" for feat in stat_feats for s in STAT_NAMES if s not in (ep_stats or {}).get(feat, {})]
        if missing and meta.stats is None:
            report.add("stats", f"missing {', '.join(missing[:6])} and no meta/stats.json", eps_file,
                       ep.episode_index)


def _check_v2_stats(meta: DatasetMeta, report: Report, stat_feats: list[str]) -> None:
    sfile = layout.V21_EPISODES_STATS_PATH
    if meta.version == layout.V20:
        return  # v2.0 never had per-episode stats; _check_info says they are computed
    if not meta.episode_stats:
        report.warn("stats", "per-episode stats file is missing (computed from the data at conversion; LeRobot's "
                    "converter refuses this dataset)", sfile)
        return
    for ep in meta.episodes:
        ep_stats = meta.episode_stats.get(ep.episode_index)
        if ep_stats is None:
            report.warn("stats", "no stats for this episode (computed from the data at conversion)", sfile,
                        ep.episode_index)
            continue
        for feat in stat_feats:
            missing = [s for s in STAT_NAMES if s not in ep_stats.get(feat, {})]
            if missing:
                report.warn("stats", f"missing {', '.join(missing)} (computed from the data at conversion)", sfile,
                            ep.episode_index, feat)
