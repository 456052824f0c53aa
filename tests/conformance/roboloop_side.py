"""roboloop's verdict on a dataset: validate, convert (v2.x), load with the training loader."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.report import Report
from roboloop.datasets.validate import validate
from tests.conformance.lerobot_side import Snapshot, sample_indices


@dataclass
class Verdict:
    report: Report
    v3: Path | None = None
    snapshot: Snapshot | None = None


def load(v3: Path) -> Snapshot:
    """What roboloop's trainer reads (`V3Dataset`), plus decoded camera frames at the sampled indices."""
    from roboloop.training.data import V3Dataset

    ds = V3Dataset(v3)
    bounds = [(ds.ep_from[ep.episode_index], ds.ep_to[ep.episode_index]) for ep in ds.meta.episodes]
    snap = Snapshot(state=ds.state, action=ds.action, bounds=bounds, tasks=[ds.task(lo) for lo, _ in bounds])
    info = ds.meta.info
    for i in sample_indices(bounds):
        ep, frame = int(ds.episode_index[i]), int(ds.frame_index[i])
        for key in ds.video_keys:
            h, w = info.features[key].shape[:2]
            snap.frames.setdefault(key, {})[i] = ds.decode_window(ep, key, frame, 1, (h, w))[0]
    for key in info.image_keys:
        snap.frames[key] = _parquet_images(v3, ds, key, sample_indices(bounds))
    return snap


def _parquet_images(v3: Path, ds, key: str, indices: list[int]) -> dict[int, np.ndarray]:
    from PIL import Image

    out = {}
    for path in sorted((v3 / "data").rglob("*.parquet")):
        table = pq.read_table(path, columns=["index", key])
        where = {int(g): r for r, g in enumerate(table["index"].to_pylist())}
        for i in indices:
            if i in where:
                cell = table[key][where[i]].as_py()
                with Image.open(io.BytesIO(cell["bytes"])) as img:
                    out[i] = np.asarray(img.convert("RGB"))
    return out


def run(src: Path, work: Path) -> Verdict:
    report = validate(src)
    if not report.ok:
        return Verdict(report)
    v3 = src
    if report.version != "v3.0":
        v3 = convert(src, work / "roboloop_v30", ConvertConfig(progress=False, workers=2))
    return Verdict(report, v3, load(v3))
