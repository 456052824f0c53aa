"""`make gpu-check`: every GPU measurement roboloop waits for, in one run of at most 8 minutes on one H100 or H200,
with only what `make install` brings. Prints one JSON line (device, commit, date, and each part's own JSON line or
why it did not give one); `--out FILE` also writes it there, for the results.

Parts, each a bench of its own run with a time budget (what a part does not finish in its budget is reported, and the
next part runs):
  compile_vla      bench/compile.py --device cuda: the demo's VLA, compiled blocks vs eager (speedup_vla)
  bf16_eager       bench/precision.py at `base`, eager: bf16 step time and MFU (with FP8's, for the record)
  compiled         bench/precision.py --compile at `base` and `n15`: bf16 compiled step time and MFU, FP8 compiled
                   vs bf16 compiled (speedup)
  fp8_grid         bench/precision.py --grid --compile: the per-linear FP8 break-even, compiled (what precision=auto
                   reads for a run that compiles its blocks; recorded in the cache dir)
  act_lerobot      bench/lerobot_train.py --device cuda: ACT at 480x640 through roboloop vs lerobot-train
                   (samples/s, data-wait fraction)
  diffusion        the same for Diffusion
  serve            bench/serve.py --device cuda: served p50/p99 of the demo's VLA and ACT
  gpu_tests        pytest -m gpu: the suite's GPU tests (compiled bf16, FP8, the default GPU path, ...)

Without a CUDA GPU it says so and exits 2: nothing here measures a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
PARTS: dict[str, tuple[list[str], int]] = {  # name -> (command, seconds)
    "compile_vla": ([PY, "bench/compile.py", "--kinds", "vla", "--device", "cuda", "--steps", "200"], 75),
    "bf16_eager": ([PY, "bench/precision.py", "--presets", "base", "--steps", "20"], 30),
    "compiled": ([PY, "bench/precision.py", "--presets", "base", "n15", "--steps", "20", "--compile"], 110),
    "fp8_grid": ([PY, "bench/precision.py", "--grid", "--compile"], 55),
    "act_lerobot": ([PY, "bench/lerobot_train.py", "--device", "cuda", "--policy", "act", "--steps", "30",
                     "--batch", "8", "--workers", "8"], 55),
    "diffusion": ([PY, "bench/lerobot_train.py", "--device", "cuda", "--policy", "diffusion", "--steps", "30",
                   "--batch", "8", "--workers", "8", "--height", "96", "--width", "96"], 40),
    "serve": ([PY, "bench/serve.py", "--device", "cuda", "--clients", "1", "8", "--seconds", "3",
               "--ray-replicas"], 40),
    "gpu_tests": ([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/unit"], 70),
}

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/gpu_check.py", "roboloop/training", "roboloop/policies", "roboloop/serving"]


def last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def run_part(name: str, cmd: list[str], budget: int) -> dict:
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {"ok": False, "why": f"past its {budget} s budget", "tail": out[-600:]}
    took = round(time.monotonic() - t0, 1)
    if name == "gpu_tests":
        summary = next((line for line in reversed(r.stdout.splitlines()) if "passed" in line or "failed" in line),
                       r.stdout[-300:])
        return {"ok": r.returncode == 0, "seconds": took, "summary": summary.strip()}
    found = last_json(r.stdout)
    if r.returncode or found is None:
        return {"ok": False, "seconds": took, "why": f"exit {r.returncode}", "tail": (r.stderr or r.stdout)[-600:]}
    return {"ok": True, "seconds": took, "result": found}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=sorted(PARTS), help="these parts only")
    ap.add_argument("--out", type=Path, help="also write the JSON line here")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu-check needs a CUDA GPU: none is visible here (nothing on a CPU stands in for these figures)",
              file=sys.stderr)
        return 2
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    out: dict = {"bench": "gpu_check", "device": torch.cuda.get_device_name(), "commit": commit,
                 "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "parts": {}}
    for name in args.only or PARTS:
        cmd, budget = PARTS[name]
        print(f"gpu-check: {name} (at most {budget} s)", file=sys.stderr, flush=True)
        out["parts"][name] = run_part(name, cmd, budget)
    emit(out, MEASURES)
    line = json.dumps(out)
    if args.out:
        args.out.write_text(line + "\n")
    return 0 if all(p["ok"] for p in out["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
