"""Start-up cost of the CLI: `roboloop --help` and `roboloop validate` on a small dataset (median of 5 runs).

Target: `roboloop --help` <= 0.5 s. Prints one JSON line.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROBOLOOP = [sys.executable, "-m", "roboloop.cli"]

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/startup.py", "roboloop/cli", "roboloop/__init__.py", "roboloop/datasets"]


def wall(cmd: list[str], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)  # a crashing command is no timing
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    from roboloop.datasets.generate import GenSpec, generate_v21

    with tempfile.TemporaryDirectory() as tmp:
        ds = generate_v21(Path(tmp) / "ds", GenSpec(num_episodes=4, min_length=10, max_length=12,
                                                    cameras={"observation.images.top": (32, 32)}))
        out = {"python_s": round(wall([sys.executable, "-c", "pass"]), 3),
               "help_s": round(wall([*ROBOLOOP, "--help"]), 3),
               "validate_s": round(wall([*ROBOLOOP, "validate", str(ds)]), 3)}
    out["help_target_met"] = out["help_s"] <= 0.5
    emit(out, MEASURES)


if __name__ == "__main__":
    main()
