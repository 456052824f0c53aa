"""roboloop's v2.1->v3 converter vs LeRobot's, same dataset, one run.

    python bench/convert.py [--dataset V21_DIR] [--episodes 100] [--frames 300]

Without --dataset it generates the reference-sized dataset (100 episodes, one 480x640 h264
camera, ~300 MB) under bench/out/ once and reuses it. Each converter runs in its own
process on its own copy (LeRobot's moves its input aside); wall time and peak RSS of that
process tree are measured. Ends with one JSON line; ratio = roboloop / LeRobot wall time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/convert.py", "roboloop/datasets"]


def run(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of the whole process tree (workers summed), sampled every 20 ms."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed:\n{proc.stderr.read().decode()[-3000:]}")
    return wall, peak / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", type=Path, help="a LeRobot v2.1 dataset (default: generate one)")
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--frames", type=int, default=300, help="mean frames per episode when generating")
    ap.add_argument("--workdir", type=Path, default=HERE / "out")
    args = ap.parse_args()
    src = args.dataset
    if src is None:
        src = args.workdir / f"v21_{args.episodes}x{args.frames}_480x640"
        if not src.exists():
            from roboloop.datasets.generate import GenSpec, generate_v21

            print(f"generating {src} ...", file=sys.stderr)
            generate_v21(src, GenSpec(num_episodes=args.episodes, min_length=int(args.frames * 0.8),
                                      max_length=int(args.frames * 1.2),
                                      cameras={"observation.images.top": (480, 640)}, image_keys={},
                                      noise=8, crf=23, seed=0))
    size_mb = sum(p.stat().st_size for p in src.rglob("*") if p.is_file()) / 2**20
    work = args.workdir / "run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    lr_root = work / "lerobot" / "ds"
    shutil.copytree(src, lr_root)

    # a conversion, its receipt (source and output md5s) included; never a cache hit from an earlier run
    ours_wall, ours_rss = run([sys.executable, "-m", "roboloop.cli", "convert", str(src),
                                         str(work / "roboloop"), "--no-progress", "--no-cache"])
    lr_wall, lr_rss = run([sys.executable, "-m", "lerobot.scripts.convert_dataset_v21_to_v30",
                                     "--repo-id=bench/ds", f"--root={lr_root}", "--push-to-hub=false"])
    emit({
        "dataset": str(src), "dataset_mb": round(size_mb, 1), "cpus": os.cpu_count(),
        "roboloop_wall_s": round(ours_wall, 2), "lerobot_wall_s": round(lr_wall, 2),
        "roboloop_peak_rss_mb": round(ours_rss, 1), "lerobot_peak_rss_mb": round(lr_rss, 1),
        "ratio": round(ours_wall / lr_wall, 3), "rss_ratio": round(ours_rss / lr_rss, 3),
    }, MEASURES)


if __name__ == "__main__":
    main()
