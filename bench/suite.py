"""The test suite's time and pass count, as `make test` runs it: pytest-xdist workers (one per core, at most 4)
sharing the cores, the longest work units first (tests/schedule.py).

    python bench/suite.py [--workers N] [PYTEST_ARGS ...]   # no PYTEST_ARGS: the whole suite (pyproject's testpaths)

Times pytest alone (`make test` installs first; a warm install is seconds). The figures are the counts of pytest's
last line (passed, failed, skipped, errors) and the wall minutes; its output goes to `--log` (default
`.roboloop/suite.log`), its last lines to stderr. Baseline: CI's limits, 60 minutes on the slowest 2-core machine
(some are 1.7x slower than another), 90 at most: `ci_budget_ratio` is the wall time x 1.7 / 60 minutes. The code
it measures is the whole repository's: any commit to roboloop/ or tests/ makes a record stale. Ends with one JSON
line.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/suite.py", "roboloop", "tests", "tasks", "flows", "Makefile", "pyproject.toml"]
SLOWEST_MACHINE = 1.7  # CI's slowest 2-core machines against another (the project's CI notes)


def counts(summary: str) -> dict:
    """pytest's last line, e.g. '=== 2 failed, 656 passed, 19 skipped in 2680.75s (0:44:40) ==='."""
    found = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", summary)}
    if "error" in found:
        found["errors"] = found.pop("error")
    return {k: found.get(k, 0) for k in ("passed", "failed", "skipped", "errors")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 4), help="0: one process")
    ap.add_argument("--log", type=Path, default=ROOT / ".roboloop" / "suite.log")
    args, pytest_args = ap.parse_known_args()
    threads = max(1, (os.cpu_count() or 1) // args.workers) if args.workers else os.cpu_count() or 1
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **{k: str(threads) for k in
                                                     ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}}
    dist = ["-n", str(args.workers), "--dist", "loadgroup", "--no-loadscope-reorder"] if args.workers else []
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--durations=30", *dist, *pytest_args]
    args.log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with args.log.open("w") as log:
        code = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    minutes = (time.perf_counter() - t0) / 60
    lines = args.log.read_text().strip().splitlines()
    print("\n".join(lines[-15:]), file=sys.stderr)
    if not lines or not re.search(r"\d+ (passed|failed|skipped)", lines[-1]):
        raise SystemExit(f"bench/suite.py: pytest ended (exit {code}) without its summary line; see {args.log}")
    emit({"exit_code": code, **counts(lines[-1]), "wall_minutes": round(minutes, 1), "workers": args.workers,
          "threads_per_worker": threads, "selection": pytest_args or ["(the whole suite)"],
          "baseline": f"CI's 60-minute target on its slowest 2-core machines ({SLOWEST_MACHINE}x slower)",
          "ci_budget_ratio": round(minutes * SLOWEST_MACHINE / 60, 2)}, MEASURES)


if __name__ == "__main__":
    main()
