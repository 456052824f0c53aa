"""Start-up costs: the CLI (`roboloop --help`, `roboloop validate` on a small dataset; median of 5 runs) and a
simulator stage, cold (a new interpreter: `ROBOLOOP_WARM_WORKERS=0`) and on a warm worker (roboloop.warm).

    python bench/startup.py [--model DIR] [--episodes 6] [--runs 3]

The stage is a six-episode evaluation of the demo's model on its task (`Roboloop-Reach-Color-v0`, 16 envs, as the
loop evaluates), through `roboloop.warm.run_entry` as the loop starts it, timed from the call to its result. `--model`:
a trained demo model (`make demo`'s artifacts/models/tiny-*); by default the demo's network untrained (the same
forward passes; the outcomes differ). `eval_cold_s` is the median of `--runs` cold starts, `eval_warm_s` the median
of `--runs` warm ones after a first stage on the worker. Targets: `roboloop --help` <= 0.5 s, a warm six-episode
evaluation < 2 s. Baseline: the cold start (`eval_warm_speedup`). Prints one JSON line.
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
MEASURES = ["bench/startup.py", "roboloop/cli", "roboloop/__init__.py", "roboloop/datasets", "roboloop/warm.py",
            "roboloop/entry.py", "roboloop/evaluation"]
TASK = "Roboloop-Reach-Color-v0"


def wall(cmd: list[str], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)  # a crashing command is no timing
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def demo_network(path: Path) -> Path:
    """The demo's network (the `tiny` preset, an 8-step chunk, the task's state and action), untrained."""
    import json

    import torch
    from safetensors.torch import save_file

    from roboloop.evaluation.run import task_schema
    from roboloop.training.config import tiny
    from roboloop.training.model import VLAPolicy

    _, state, action, _ = task_schema(TASK)
    torch.manual_seed(0)
    cfg = tiny(state_dim=len(state or []), action_dim=len(action or []), horizon=8)
    path.mkdir(parents=True)
    save_file(VLAPolicy(cfg).state_dict(), str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model": cfg.model_dump(mode="json"), "train": {}, "data": {
        "state_key": "observation.state", "action_key": "action", "camera_keys": [], "with_video": False}}))
    (path / "stats.json").write_text(json.dumps({
        "observation.state": {"mean": [0.0] * cfg.state_dim, "std": [1.0] * cfg.state_dim},
        "action": {"mean": [0.0] * cfg.action_dim, "std": [1.0] * cfg.action_dim}}))
    return path


def stage_seconds(model: Path, work: Path, episodes: int, runs: int) -> dict:
    """The evaluation stage's wall time cold and warm (medians), and whether both gave the same episodes."""
    import json
    import os

    from roboloop import warm
    from roboloop.evaluation.config import EvalConfig

    def once(name: str) -> tuple[float, list]:
        out = work / name
        cfg = EvalConfig(policy=str(model), task=TASK, episodes=episodes, num_envs=16, execute_steps=4,
                         output_dir=str(out), videos=0)
        t0 = time.perf_counter()
        warm.run_entry("evaluate", cfg, out, lambda _: None, 600, "evaluation")
        took = time.perf_counter() - t0
        rows = json.loads((out / "report.json").read_text())["per_episode"]
        return took, [(r["index"], r["success"], round(r["ret"], 6)) for r in rows]

    os.environ["ROBOLOOP_WARM_WORKERS"] = "0"
    cold = [once(f"cold{i}") for i in range(runs)]
    os.environ["ROBOLOOP_WARM_WORKERS"] = "1"
    first = once("first")
    hot = [once(f"warm{i}") for i in range(runs)]
    warm.POOL.close()
    cold_s, warm_s = statistics.median(t for t, _ in cold), statistics.median(t for t, _ in hot)
    return {"eval_cold_s": round(cold_s, 2), "eval_first_on_worker_s": round(first[0], 2),
            "eval_warm_s": round(warm_s, 2), "eval_warm_speedup": round(cold_s / warm_s, 2),
            "eval_same_episodes": all(e == cold[0][1] for _, e in cold + hot + [first]),
            "eval_warm_target_met": warm_s < 2.0}


def main() -> None:
    import argparse

    from roboloop.datasets.generate import GenSpec, generate_v21

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a trained demo model folder (default: the demo's network)")
    ap.add_argument("--episodes", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        ds = generate_v21(Path(tmp) / "ds", GenSpec(num_episodes=4, min_length=10, max_length=12,
                                                    cameras={"observation.images.top": (32, 32)}))
        out = {"python_s": round(wall([sys.executable, "-c", "pass"]), 3),
               "help_s": round(wall([*ROBOLOOP, "--help"]), 3),
               "validate_s": round(wall([*ROBOLOOP, "validate", str(ds)]), 3)}
        model = Path(args.model) if args.model else demo_network(Path(tmp) / "model")
        out.update(stage_seconds(model, Path(tmp), args.episodes, args.runs))
    out["help_target_met"] = out["help_s"] <= 0.5
    out["model"] = "trained" if args.model else "the demo's network, untrained"
    emit(out, MEASURES)


if __name__ == "__main__":
    main()
