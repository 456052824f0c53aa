"""Per-episode stats computed from the data, for datasets that don't carry them.

v2.0 datasets have only a dataset-level meta/stats.json, and some v2.1 datasets lost their
meta/episodes_stats.jsonl; LeRobot 0.6's converter refuses both. We compute what LeRobot's
recorder would have written: min/max/mean/std/count of every numeric column, and per-channel
stats in [0, 1] of camera frames sampled with LeRobot's rule (`stats.sample_indices`), from
video (decoded at the sampled timestamps) or from images stored in the parquet.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from roboloop.datasets import stats, video
from roboloop.datasets.arrowutil import read_table, to_2d
from roboloop.datasets.meta import DatasetMeta, Episode, Stats


def compute(meta: DatasetMeta, ep: Episode) -> Stats:
    """Stats of one v2.x episode, as LeRobot's recorder writes them."""
    info = meta.info
    table = read_table(meta.root / meta.v21_data_path(ep.episode_index))
    out: Stats = {}
    for key, feat in info.features.items():
        if feat.dtype in ("video", "image", "string", "language") or key not in table.column_names:
            continue
        out[key] = stats.vector_stats(to_2d(table[key]), with_quantiles=False)
    sample = stats.sample_indices(ep.length)
    for key in info.image_keys:
        if key in table.column_names:
            cells = table[key].take(sample).to_pylist()
            out[key] = stats.image_stats(np.stack([_decode_image(c, meta.root) for c in cells]))
    for key in info.video_keys:
        path = meta.root / meta.v21_video_path(ep.episode_index, key)
        frames = video.decode_frames_at(path, [i / info.fps for i in sample], tolerance_s=0.5 / info.fps)
        out[key] = stats.image_stats(frames)
    return out


def _decode_image(cell: dict | None, root: Path) -> np.ndarray:
    from PIL import Image

    if not cell:
        raise ValueError("empty image cell")
    data = cell.get("bytes")
    if data is None and cell.get("path"):
        data = (root / cell["path"]).read_bytes()
    if data is None:
        raise ValueError("image cell has neither bytes nor a path")
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def fill_missing(meta: DatasetMeta, workers: int = 1) -> dict[int, Stats]:
    """Per-episode stats for every episode, computing the ones the dataset lacks (or lacks features of)."""
    wanted = [k for k, f in meta.info.features.items() if f.dtype not in ("string", "language")]
    todo = [ep for ep in meta.episodes
            if any(s not in meta.episode_stats.get(ep.episode_index, {}).get(k, {}) for k in wanted
                   for s in ("min", "max", "mean", "std", "count"))]
    out = dict(meta.episode_stats)
    if not todo:
        return out
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, workers)) as pool:  # decoding and parquet reads release the GIL
        for ep, st in zip(todo, pool.map(lambda e: compute(meta, e), todo), strict=True):
            out[ep.episode_index] = {**out.get(ep.episode_index, {}), **st}
    return out
