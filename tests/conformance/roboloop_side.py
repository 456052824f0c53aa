"""roboloop's verdict on a dataset: validate, convert (v2.x), load with the training loader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
    """What roboloop's trainer reads (`V3Dataset`): state, action, bounds, tasks, and every camera (video,
    image-in-parquet, depth) decoded by the training loader at its stored resolution."""
    from roboloop.training.data import V3Dataset

    ds = V3Dataset(v3)
    bounds = [(ds.ep_from[ep.episode_index], ds.ep_to[ep.episode_index]) for ep in ds.meta.episodes]
    snap = Snapshot(state=ds.state, action=ds.action, bounds=bounds, tasks=[ds.task(lo) for lo, _ in bounds],
                    depth_keys={c.key for c in ds.cameras if c.depth})
    for i in sample_indices(bounds):
        ep, frame = int(ds.episode_index[i]), int(ds.frame_index[i])
        for key in ds.camera_keys:
            snap.frames.setdefault(key, {})[i] = ds.decode_window(ep, key, frame, 1)[0]
    return snap


def run(src: Path, work: Path) -> Verdict:
    report = validate(src)
    if not report.ok:
        return Verdict(report)
    v3 = src
    if report.version != "v3.0":
        v3 = convert(src, work / "roboloop_v30", ConvertConfig(progress=False, workers=2))
    return Verdict(report, v3, load(v3))
