"""Evaluation throughput on CPU: env-steps/s and policy-steps/s at 1, 16 and 64 envs.

    python bench/eval.py [--envs 1 16 64] [--episodes-per-env 1] [--task Roboloop-Reach-Color-v0]

Runs `roboloop evaluate` in a fresh process per setting (Isaac Lab keeps one simulation per
process) three times: with the random policy (the simulation alone: a scripted baseline without videos
renders no camera), the same with Isaac Lab's own eager CPU step (`ROBOLOOP_CPU_GRAPH=0`, the baseline
of `graph_speedup`: roboloop/sim/cpu_graph.py replays the step as a Warp graph; the episodes are
the same, bit for bit), and with an untrained `tiny` VLA (what evaluating a checkpoint costs: camera
rendering and batched inference with 4 Euler steps, 8 of the 16 chunk actions executed per plan).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/eval.py", "roboloop/evaluation", "roboloop/sim", "roboloop/policies"]


def task_dims(task: str) -> tuple[int, int]:
    """(state, action) dimensions the task observes and takes, read from its env config (never hard-coded: a
    task that changes its observation must not break the bench)."""
    from roboloop.sim.isaac_tasks import isaac_tasks, make_cfg

    if task not in isaac_tasks():
        raise SystemExit(f"bench/eval.py measures roboloop's Isaac Lab tasks ({', '.join(isaac_tasks())}), not "
                         f"{task!r}")
    cfg = make_cfg(task)
    space = cfg.action_space
    return int(cfg.observation_space), int(space if isinstance(space, int) else space.shape[-1])


def tiny_model(dst: Path, task: str) -> Path:
    """An untrained tiny policy with the task's shapes (speed does not depend on weights)."""
    from safetensors.torch import save_file

    from roboloop.training.config import tiny
    from roboloop.training.model import VLAPolicy

    state_dim, action_dim = task_dims(task)
    cfg = tiny(state_dim=state_dim, action_dim=action_dim)
    model = VLAPolicy(cfg)
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(dst / "model.safetensors"))
    data = {"state_key": "observation.state", "action_key": "action", "camera_keys": ["observation.images.top"],
            "with_video": True}
    (dst / "config.json").write_text(json.dumps({"model": cfg.model_dump(), "data": data}))
    (dst / "stats.json").write_text(json.dumps({"observation.state": {"mean": [0.0] * state_dim,
                                                                      "std": [1.0] * state_dim},
                                                "action": {"mean": [0.0] * action_dim, "std": [1.0] * action_dim}}))
    return dst


def run(policy: str, task: str, envs: int, episodes: int, out: Path, graph: bool = True) -> dict:
    cmd = [sys.executable, "-m", "roboloop.cli", "evaluate", "--policy", policy, "--task", task, "--num-envs",
           str(envs), "--episodes", str(episodes), "--videos", "0", "--output-dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "ROBOLOOP_CPU_GRAPH": "1" if graph else "0"})
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--episodes-per-env", type=int, default=1)
    ap.add_argument("--task", default="Roboloop-Reach-Color-v0")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model(Path(tmp) / "tiny", args.task)
        for n in args.envs:
            eps = max(n * args.episodes_per_env, 2)
            r = run("random", args.task, n, eps, Path(tmp) / f"r{n}")
            e = run("random", args.task, n, eps, Path(tmp) / f"e{n}", graph=False)
            if "+graph" not in r["backend"] or e["per_episode"] != r["per_episode"]:
                raise SystemExit(f"{n} envs: the replayed step ({r['backend']}) did not give the eager step's "
                                 "episodes")
            m = run(str(model), args.task, n, eps, Path(tmp) / f"m{n}")
            results[str(n)] = {"env_steps_per_s": round(r["env_steps_per_s"], 1),
                               "eager_env_steps_per_s": round(e["env_steps_per_s"], 1),
                               "graph_speedup": round(r["env_steps_per_s"] / e["env_steps_per_s"], 2),
                               "env_steps_per_s_with_tiny_policy": round(m["env_steps_per_s"], 1),
                               "policy_steps_per_s": round(m["policy_steps_per_s"], 1)}
            print(f"{n:3d} envs: {results[str(n)]}", file=sys.stderr)
    emit({"task": args.task, "device": "cpu", "results": results,
          "baseline": "graph_speedup: Isaac Lab's eager CPU step (ROBOLOOP_CPU_GRAPH=0) on the same random episodes"},
         MEASURES)


if __name__ == "__main__":
    main()
