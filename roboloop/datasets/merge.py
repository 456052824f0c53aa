"""Aggregate LeRobot v2.x datasets into one new v2.1 dataset (DAgger: the data so far + a round's labels).

The sources are read, never written. Episodes are renumbered in source order (source 0's
episodes first), tasks are merged by their text, and the per-frame `episode_index`, `index`
and `task_index` columns are rewritten to match; videos are copied as they are (one mp4
per episode and camera in v2.x, so nothing is re-encoded). Sources must agree on fps and
on every feature's dtype and shape: the first difference is named. The result is built in
a temporary sibling and renamed into place, with roboloop's marker and the sources' names
(`merged_from`) in the marker, so the lineage of a dataset version is in the dataset.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from roboloop import fsutil
from roboloop.datasets import layout, stats
from roboloop.datasets.meta import DatasetMeta, load_meta


class MergeError(ValueError):
    """Sources that cannot be one dataset (different fps, features or format)."""


def _signature(meta: DatasetMeta) -> dict:
    return {k: (f.dtype, list(f.shape)) for k, f in meta.info.features.items()}


def check_compatible(metas: list[DatasetMeta]) -> None:
    first = metas[0]
    for m in metas:
        if not m.is_v2:
            raise MergeError(f"{m.root} is {m.version}: merging takes v2.0/v2.1 datasets (one file per episode)")
    for m in metas[1:]:
        if m.info.fps != first.info.fps:
            raise MergeError(f"{m.root}: fps {m.info.fps} != {first.info.fps} of {first.root}")
        a, b = _signature(first), _signature(m)
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                raise MergeError(f"{m.root}: feature {key!r} is {b.get(key) or 'missing'}, {first.root} has "
                                 f"{a.get(key) or 'none'}")


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _index_stats(values: np.ndarray) -> dict:
    return stats.to_jsonable({"x": stats.vector_stats(values.reshape(-1, 1).astype(np.float64),
                                                      with_quantiles=False)})["x"]


def merge_v21(sources: list[str | Path], dst: str | Path, overwrite: bool = False,
              merged_from: list[str] | None = None) -> Path:
    """One v2.1 dataset at `dst` holding every episode of `sources`, in order. `merged_from` names the sources in
    the output's marker (default: their folder names; the loop gives their DVC md5s, so the content, and its md5,
    does not depend on where the sources lie)."""
    if len(sources) < 1:
        raise MergeError("nothing to merge")
    metas = [load_meta(s) for s in sources]
    check_compatible(metas)
    first = metas[0]
    chunks_size = first.info.chunks_size
    video_keys = first.info.video_keys
    tasks: dict[str, int] = {}
    episodes: list[dict] = []
    stats_rows: list[dict] = []
    frames = 0
    with fsutil.atomic_dir(dst, "dataset", overwrite=overwrite,
                           meta={"merged_from": merged_from or [Path(s).name for s in sources]}) as tmp:
        for meta in metas:
            src_stats = {int(r["episode_index"]): r["stats"]
                         for r in _read_jsonl(meta.root / layout.V21_EPISODES_STATS_PATH)}
            for ep in meta.episodes:
                new = len(episodes)
                table = pq.read_table(layout.safe_join(meta.root, meta.v21_data_path(ep.episode_index)))
                old_tasks = np.asarray(table["task_index"].to_numpy(zero_copy_only=False))
                remap = {int(t): tasks.setdefault(meta.tasks[int(t)], len(tasks)) for t in np.unique(old_tasks)}
                cols = {"episode_index": np.full(len(table), new, dtype=np.int64),
                        "index": np.arange(frames, frames + len(table), dtype=np.int64),
                        "task_index": np.asarray([remap[int(t)] for t in old_tasks], dtype=np.int64)}
                for name, values in cols.items():
                    table = table.set_column(table.schema.get_field_index(name), name, pa.array(values))
                chunk = layout.chunk_of(new, chunks_size)
                out = tmp / layout.V21_DATA_PATH.format(episode_chunk=chunk, episode_index=new)
                out.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(table, out)
                for key in video_keys:
                    src = layout.safe_join(meta.root, meta.v21_video_path(ep.episode_index, key))
                    vdst = tmp / layout.V21_VIDEO_PATH.format(episode_chunk=chunk, video_key=key, episode_index=new)
                    vdst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, vdst)
                ep_stats = dict(src_stats.get(ep.episode_index, {}))
                if ep_stats:
                    ep_stats.update({k: _index_stats(v) for k, v in cols.items()})
                    stats_rows.append({"episode_index": new, "stats": ep_stats})
                episodes.append({"episode_index": new, "tasks": [meta.tasks[int(t)] for t in np.unique(old_tasks)],
                                 "length": len(table)})
                frames += len(table)
        n = len(episodes)
        (tmp / "meta").mkdir(exist_ok=True)
        _write_jsonl(tmp / layout.V21_TASKS_PATH, [{"task_index": i, "task": t} for t, i in tasks.items()])
        _write_jsonl(tmp / layout.V21_EPISODES_PATH, episodes)
        if len(stats_rows) == n:  # else a source lacked them: the converter computes them from the data
            _write_jsonl(tmp / layout.V21_EPISODES_STATS_PATH, stats_rows)
        info = json.loads((first.root / layout.INFO_PATH).read_text())
        info.update(codebase_version=layout.V21, total_episodes=n, total_frames=frames, total_tasks=len(tasks),
                    total_videos=n * len(video_keys), total_chunks=layout.chunk_of(n - 1, chunks_size) + 1,
                    splits={"train": f"0:{n}"}, data_path=layout.V21_DATA_PATH,
                    video_path=layout.V21_VIDEO_PATH if video_keys else None)
        (tmp / layout.INFO_PATH).write_text(json.dumps(info, indent=4))
    return Path(dst).absolute()


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
