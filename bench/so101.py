"""The SO-101 pick-cube task on this machine: simulator speed, and who picks the cube on the same unseen cubes.

    python bench/so101.py [--episodes 96] [--num-envs 16] [--policy MODEL_DIR|registry:NAME@champion] [--device cpu]
                          [--speed-envs 16 256 1024]

Rows (each in its own process: Isaac Lab keeps one simulation per process):
- env-steps/s of `Roboloop-SO101-PickCube-v0` with random actions, with the two 96x128 cameras rendered and
  without them (the baseline: the same scene, physics only), at `--num-envs` and at each of `--speed-envs`;
- success of the scripted expert and of random actions on the same `--episodes` test-split cube positions
  (Wilson 95% interval), and of `--policy` when given (a model trained by `roboloop loop --preset so101`;
  its training minutes are read from its metrics.jsonl).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
TASK = "Roboloop-SO101-PickCube-v0"

SPEED = """
import json, sys, time, torch
from roboloop.sim.isaac import IsaacLabEnv
n, cam, steps, device = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4]
with IsaacLabEnv(sys.argv[5], num_envs=n, camera=cam, device=device) as env:
    env.reset()
    g = torch.Generator().manual_seed(0)
    def act():
        return env.action_low + torch.rand(n, env.action_dim, generator=g) * (env.action_high - env.action_low)
    for _ in range(10):
        env.step(act())
    t = time.perf_counter()
    for _ in range(steps):
        env.step(act())
    print(json.dumps({"env_steps_per_s": steps * n / (time.perf_counter() - t)}))
"""

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/so101.py", "roboloop/evaluation", "roboloop/policies"]


def speed(num_envs: int, camera: bool, steps: int, device: str) -> float:
    p = subprocess.run([sys.executable, "-c", SPEED, str(num_envs), "1" if camera else "0", str(steps), device, TASK],
                       capture_output=True, text=True, check=True)
    return float(json.loads(p.stdout.strip().splitlines()[-1])["env_steps_per_s"])


def train_minutes(model: str) -> float | None:
    """Wall minutes of the training run: from run_config.json (written as it starts) to its last heartbeat."""
    folder = Path(model)
    beat, start = folder / "heartbeat.json", folder / "run_config.json"
    if not (beat.is_file() and start.is_file()):
        return None
    return round((json.loads(beat.read_text())["time"] - start.stat().st_mtime) / 60, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=96)
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--speed-steps", type=int, default=100,
                    help="steps each speed row times; 0: no speed rows (success only, e.g. beside other work)")
    ap.add_argument("--policy", help="a model folder or registry reference to evaluate beside expert and random")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--speed-envs", type=int, nargs="*", default=[],
                    help="also time the simulator at these numbers of envs (e.g. 256 1024 on a GPU)")
    args = ap.parse_args()

    from roboloop.evaluation.config import EvalConfig, EvalRecipe
    from roboloop.evaluation.run import evaluate_in_subprocess

    out: dict = {"task": TASK, "device": args.device, "num_envs": args.num_envs}
    def row(n: int) -> dict:
        return {k: round(speed(n, cam, args.speed_steps, args.device), 1)
                for k, cam in (("no_cameras", False), ("cameras", True))}

    if args.speed_steps:
        out.update({f"env_steps_per_s_{k}": v for k, v in row(args.num_envs).items()})
    out["speed"] = []
    for n in args.speed_envs if args.speed_steps else ():
        out["speed"].append({"num_envs": n, **row(n)})
        print(f"[progress] {json.dumps(out['speed'][-1])}", file=sys.stderr, flush=True)
    recipe = EvalRecipe(task=TASK, episodes=args.episodes, num_envs=args.num_envs, videos=0, device=args.device)
    who = ["expert", "random"] + ([args.policy] if args.policy else [])
    with tempfile.TemporaryDirectory(prefix="roboloop-so101-") as tmp:
        for i, policy in enumerate(who):
            t = time.perf_counter()
            r = evaluate_in_subprocess(EvalConfig.of(recipe, policy, str(Path(tmp) / str(i))), on_line=lambda _: None)
            name = policy if policy in ("expert", "random") else "policy"
            out[name] = {"success": r["success_rate"], "ci": [round(r["ci_low"], 3), round(r["ci_high"], 3)],
                         "episodes": r["episodes"], "wall_s": round(time.perf_counter() - t, 1)}
            print(f"[progress] {name}: {json.dumps(out[name])}", file=sys.stderr, flush=True)
    if args.policy and not args.policy.startswith("registry:"):
        out["policy"]["train_minutes"] = train_minutes(args.policy)
    table(out, who)
    emit(out, MEASURES)


def table(out: dict, who: list[str]) -> None:
    """The figures as a person reads them (before the JSON line)."""
    for k in ("env_steps_per_s_no_cameras", "env_steps_per_s_cameras"):
        if k in out:
            print(f"{k:32s} {out[k]:10.1f}")
    for row in out["speed"]:
        print(f"{row['num_envs']:6d} envs: {row['no_cameras']:10.1f} env-steps/s without cameras, "
              f"{row['cameras']:10.1f} with")
    for name in who:
        row = out["policy" if name not in ("expert", "random") else name]
        print(f"{name[:32]:32s} {row['success']:10.3f}  CI {row['ci'][0]:.3f}-{row['ci'][1]:.3f}")
    if "env_steps_per_s_cameras" in out:
        print(f"cameras cost {out['env_steps_per_s_no_cameras'] / out['env_steps_per_s_cameras']:.2f}x "
              "(baseline: the same scene without rendering)")


if __name__ == "__main__":
    main()
