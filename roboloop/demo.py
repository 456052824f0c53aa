"""`make demo`: the loop on embedded defaults, as far as it is built.

Today: raw LeRobot v2.1 data in `data/` (DVC-tracked by `data.dvc`; pulled from the
local DVC remote, or regenerated deterministically on a fresh clone) -> validate ->
convert to v3.0 -> load with LeRobot's own `LeRobotDataset` -> DVC-track the v3 output.
Training, evaluation and registration join as those stages land.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from roboloop import dvc
from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.datasets.ingest import ingest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
OUT = REPO / "artifacts"  # stage outputs; their .dvc files are what lineage cites

# The demo's raw dataset: small enough for a 2-core laptop, shaped like real recordings.
DEMO_SPEC = GenSpec(
    num_episodes=24, min_length=40, max_length=90, fps=30,
    cameras={"observation.images.top": (96, 128), "observation.images.wrist": (72, 96)},
    seed=2026,
)


def step(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def ensure_raw_data() -> None:
    if (DATA / "meta" / "info.json").exists():
        return
    if (REPO / "data.dvc").exists():
        pulled = subprocess.run([sys.executable, "-m", "dvc", "pull", "-q", "data.dvc"], cwd=REPO,
                                capture_output=True, text=True)
        if pulled.returncode == 0 and (DATA / "meta" / "info.json").exists():
            print("pulled data/ from the DVC remote")
            return
        shutil.rmtree(DATA, ignore_errors=True)
    print("no DVC copy of data/ here: generating the demo dataset (deterministic)")
    generate_v21(DATA, DEMO_SPEC)


def main() -> int:
    t0 = time.time()
    step("ingest + validate data/ (LeRobot v2.1)")
    ensure_raw_data()
    raw = ingest(DATA, strict=False)
    print(raw.report.human())
    if not raw.report.ok:
        return 1
    step("convert v2.1 -> v3.0")
    dst = OUT / "dataset_v3"
    shutil.rmtree(dst, ignore_errors=True)
    convert(DATA, dst, ConvertConfig(progress=True))
    step("load the v3 dataset with LeRobot's LeRobotDataset")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("roboloop/demo", root=dst)
    item = ds[len(ds) // 2]
    print(f"{ds.num_episodes} episodes, {len(ds)} frames; sample keys: {sorted(item)[:6]} ...")
    step("version with DVC")
    raw_t = dvc.track(DATA, repo_root=REPO)
    v3_t = dvc.track(dst, repo_root=REPO)
    summary = {
        "raw_dataset": str(DATA.relative_to(REPO)), "raw_md5": raw_t.md5,
        "v3_dataset": str(dst.relative_to(REPO)), "v3_md5": v3_t.md5,
        "dvc_remote": ".roboloop/dvc-remote", "episodes": ds.num_episodes, "frames": len(ds),
        "seconds": round(time.time() - t0, 1),
    }
    step("done")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
