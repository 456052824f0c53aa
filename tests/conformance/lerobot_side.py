"""LeRobot 0.6.1 as the reference: its writer, its v2.1 -> v3.0 converter and its loader.

Everything runs in-process on copies (LeRobot's converter moves its input aside). "LeRobot
accepts a dataset" means: (v2.x) its converter converts it, and (all) `LeRobotDataset` opens
the result and returns the first and last frame of every episode, cameras decoded.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@dataclass
class Snapshot:
    """What a loader returns for a dataset: the numbers training sees."""

    state: np.ndarray  # (N, S) in global index order
    action: np.ndarray
    bounds: list[tuple[int, int]]  # per episode [from, to)
    tasks: list[str]  # per episode: the task of its first frame
    # key -> {global index: HxWx3 uint8 (colour) or HxWx1 float32 millimetres (depth)}
    frames: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)
    depth_keys: set[str] = field(default_factory=set)


@dataclass
class Outcome:
    ok: bool
    error: str = ""
    error_type: str = ""
    root: Path | None = None  # the v3 dataset LeRobot read
    snapshot: Snapshot | None = None


@contextlib.contextmanager
def _quiet():
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


def convert(src: Path, work: Path) -> Path:
    """LeRobot's own v2.1 -> v3.0 converter on a copy of `src`; returns the converted folder."""
    from lerobot.scripts.convert_dataset_v21_to_v30 import convert_dataset

    root = work / "lerobot_v30"
    shutil.copytree(src, root)
    with _quiet():
        convert_dataset(repo_id="conformance/ds", root=str(root), push_to_hub=False)
    return root


def sample_indices(bounds: list[tuple[int, int]]) -> list[int]:
    return sorted({i for lo, hi in bounds for i in (lo, hi - 1)})


def load(root: Path) -> Snapshot:
    """Open with `LeRobotDataset` (PyAV decoding) and read what training reads."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    with _quiet():
        ds = LeRobotDataset("conformance/ds", root=root, video_backend="pyav")
        hf = ds.hf_dataset.with_format(None)
        order = np.argsort(np.asarray(hf["index"]))
        eps = ds.meta.episodes
        bounds = list(zip(eps["dataset_from_index"], eps["dataset_to_index"], strict=True))
        snap = Snapshot(state=np.asarray(hf["observation.state"], dtype=np.float32)[order],
                        action=np.asarray(hf["action"], dtype=np.float32)[order], bounds=bounds, tasks=[])
        cams = [*ds.meta.video_keys, *ds.meta.image_keys]
        snap.depth_keys = set(ds.meta.depth_keys)
        for i in sample_indices(bounds):
            item = ds[i]
            if any(i == lo for lo, _ in bounds):
                snap.tasks.append(item["task"])
            for key in cams:
                hwc = item[key].numpy().transpose(1, 2, 0)
                snap.frames.setdefault(key, {})[i] = hwc.astype(np.float32) if key in snap.depth_keys else \
                    np.round(hwc * 255).astype(np.uint8)
    return snap


def run(src: Path, work: Path) -> Outcome:
    """LeRobot's verdict on the dataset at `src` (any version), with what it read when it accepts."""
    import json

    try:
        version = json.loads((src / "meta/info.json").read_text())["codebase_version"]
        root = convert(src, work) if version != "v3.0" else src
        return Outcome(True, root=root, snapshot=load(root))
    except Exception as e:  # LeRobot refuses with many exception types; the type and message are what we record
        return Outcome(False, error=f"{type(e).__name__}: {e}"[:500], error_type=type(e).__name__)
