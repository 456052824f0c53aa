"""Training beside other work: the demo's VLA training alone and beside one busy process, as roboloop launches it and
as it launched it before (threads spinning while they wait).

    python bench/contention.py [--steps 50] [--warmup 10] [--episodes 64] [--work DIR]

Each arm trains `roboloop.loop.demo()`'s recipe (one rank, eager, no camera, on a generated dataset) through
`roboloop.training.launch.run_torchrun`, the loop's own launcher; `--load` arms run beside one CPU-bound process
(a Python loop at the same priority) started just before. Arms:
- `spin`: the launch before this bench (OpenMP's default wait: a thread that reaches a barrier first spins on its
  core; with another process on one of the cores it spins while the thread it waits for has no core);
- `roboloop`: as `run_torchrun` launches now (`OMP_WAIT_POLICY=PASSIVE`: a waiting thread sleeps and gives its core
  back; roboloop.training.launch).
Samples/s is the median over the steps after `--warmup`. Baseline: each arm alone. Goal: beside one busy process,
`roboloop` keeps at least 40% of its speed alone (`kept_roboloop` >= 0.4). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from compile import dataset  # noqa: E402  (bench/compile.py: the same generated dataset)
from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

MEASURES = ["bench/contention.py", "roboloop/training"]
# a busy process that never sleeps, bounded so that it can never outlive a stuck bench
BUSY = "import time\nend = time.monotonic() + 900\nwhile time.monotonic() < end: pass"


def arm(data: Path, out: Path, steps: int, warmup: int, spin: bool, load: bool) -> float:
    from roboloop.loop import demo
    from roboloop.training.config import LaunchConfig, TrainConfig
    from roboloop.training.launch import run_torchrun

    recipe = demo().train.model_copy(update={"steps": steps, "compile": "off", "checkpoint_every_steps": 0,
                                             "log_every": steps})
    env = {"OMP_WAIT_POLICY": "ACTIVE"} if spin else None  # spin: what an unset policy did before roboloop set it
    hog = subprocess.Popen([sys.executable, "-c", BUSY]) if load else None
    try:
        run_torchrun(TrainConfig.of(recipe, str(data), str(out)), LaunchConfig(), on_line=lambda _: None, env=env)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return round(statistics.median(r["samples_per_s"] for r in rows[warmup:]), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="roboloop-bench-contention-"))
    # time-shared, as a user's processes are: under a real-time policy inherited from the caller (SCHED_FIFO) the
    # busy process would keep its core from every other process pinned there for as long as it runs
    if hasattr(os, "sched_getscheduler") and os.sched_getscheduler(0) != os.SCHED_OTHER:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    data = dataset(work, args.episodes)
    line: dict = {"bench": "contention", "cores": os.cpu_count(), "steps": args.steps}
    for name, spin in (("spin", True), ("roboloop", False)):
        alone = arm(data, Path(tempfile.mkdtemp(dir=work)) / "alone", args.steps, args.warmup, spin, load=False)
        beside = arm(data, Path(tempfile.mkdtemp(dir=work)) / "load", args.steps, args.warmup, spin, load=True)
        line[name] = {"alone_samples_per_s": alone, "beside_load_samples_per_s": beside}
        line[f"kept_{name}"] = round(beside / alone, 3)
    line["target_met"] = line["kept_roboloop"] >= 0.4
    emit(line, MEASURES)


if __name__ == "__main__":
    main()
