"""What an SO-101 pick-cube recording covers and where its policy fails: reads datasets recorded by
`roboloop collect --task Roboloop-SO101-PickCube-v0 --environment-state` (demonstrations, or a DAgger round's
rollouts: `collect --policy MODEL`), v2.1 or v3, and prints per dataset

  - episodes by the cube's distance from the arm's base, and the share that ended before the 240-step limit
    (a success: the task ends an episode early only when the cube is held up);
  - at the cube (the grasp point within 1 cm across and 0-1 cm above the cube's centre): how often the action
    (the label) opens the jaws further than they are;
  - near the cube (within 3 cm across, 8 cm above): the wrist roll's offset from the roll the expert's grasp rule
    gives for that cube (fitted on the first dataset, the reference: the expert's own recordings).

    python bench/so101_data.py DEMOS [ROLLOUTS ...]
    python bench/so101_data.py --record DIR [--episodes N] [ROLLOUTS ...]   # DIR: the expert's, recorded if missing

Its last line is one JSON object (the numbers of every dataset)."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

LIMIT = 240  # Roboloop-SO101-PickCube-v0: 8 s at 30 fps
BINS = (0.17, 0.19, 0.21, 0.23, 0.25)
MIN_FIT = 8  # reference episodes at the grasp to fit the wrist roll's rule on (one cube says nothing about it)

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/so101_data.py", "roboloop/sim/isaac_tasks", "roboloop/datasets"]


def load(root: Path) -> dict[str, np.ndarray]:
    import pandas as pd

    files = sorted((root / "data").rglob("*.parquet"))
    if not files:
        raise SystemExit(f"{root}: no data/**/*.parquet")
    cols = ["observation.state", "action", "observation.environment_state", "episode_index"]
    try:
        fr = pd.concat(pd.read_parquet(f, columns=cols) for f in files)
    except (KeyError, ValueError) as e:
        raise SystemExit(f"{root}: needs {cols} (record with --environment-state): {e}") from e
    return {"state": np.stack(fr["observation.state"].to_numpy()), "action": np.stack(fr["action"].to_numpy()),
            "env": np.stack(fr["observation.environment_state"].to_numpy()), "episode": fr["episode_index"].to_numpy()}


def rule_roll(env: np.ndarray) -> np.ndarray:
    """The closing direction the expert's grasp frame picks (the cube face nearest the arm's tangential
    direction; isaac_tasks/so101_expert.grasp_frame) relative to the cube's bearing, degrees."""
    yaw, bearing = env[:, 3], np.arctan2(env[:, 1], env[:, 0])
    k = np.round((bearing - math.pi / 2 - yaw) / (math.pi / 2))
    return np.degrees(yaw + k * math.pi / 2 - bearing)


def report(d: dict[str, np.ndarray], fit: np.ndarray | None) -> dict:
    env, ep = d["env"], d["episode"]
    ids, first, length = np.unique(ep, return_index=True, return_counts=True)
    r = np.linalg.norm(env[first, :2], axis=1)
    ended = length < LIMIT - 1
    by_r = []
    for lo, hi in zip(BINS[:-1], BINS[1:], strict=True):
        m = (r >= lo) & (r < hi) if hi < BINS[-1] else (r >= lo)
        by_r.append({"cm": [round(lo * 100), round(hi * 100)], "episodes": int(m.sum()),
                     "ended_early": round(float(ended[m].mean()), 3) if m.any() else None})
    dxy = np.linalg.norm(env[:, 4:6] - env[:, :2], axis=1)
    dz = env[:, 6] - env[:, 2]
    at = (dxy < 0.01) & (dz >= 0) & (dz < 0.01)
    opens = d["action"][at, 5] > d["state"][at, 5] + 1
    rep = {"episodes": int(len(ids)), "frames": int(len(ep)), "by_distance": by_r, "at_cube_frames": int(at.sum()),
           "at_cube_labels_open": round(float(opens.mean()), 3) if at.any() else None,
           "near_frames": None, "roll_offset_deg_p5_p50_p95": None, "roll_offset_over_20deg": None}
    near = (dxy < 0.03) & (dz < 0.08)
    if fit is not None:
        rep["near_frames"] = int(near.sum())
        if near.any():
            off = d["state"][near, 4] - (fit[0] * rule_roll(env[near]) + fit[1])
            rep["roll_offset_deg_p5_p50_p95"] = [round(float(x), 1) for x in np.percentile(off, [5, 50, 95])]
            rep["roll_offset_over_20deg"] = round(float(np.mean(np.abs(off) > 20)), 3)
    return rep


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("datasets", nargs="*", help="the first is the reference: the expert's own recordings")
    ap.add_argument("--record", help="record the reference here first (the scripted expert; kept: the episodes it "
                    "picks) unless it exists; it leads the datasets")
    ap.add_argument("--episodes", type=int, default=16, help="with --record: episodes to record")
    ap.add_argument("--noise", type=float, default=0.5, help="with --record: DART noise (0.5: as the so101 preset)")
    a = ap.parse_args(argv)
    if a.record:
        if not Path(a.record).exists():
            subprocess.run([sys.executable, "-m", "roboloop.cli", "collect", a.record, "--task",
                            "Roboloop-SO101-PickCube-v0", "--episodes", str(a.episodes),
                            "--num-envs", str(min(a.episodes, 16)), "--noise", str(a.noise), "--environment-state"],
                           check=True, stdout=subprocess.DEVNULL)
        a.datasets = [a.record, *a.datasets]
    if not a.datasets:
        ap.error("give datasets or --record DIR")
    data = {p: load(Path(p)) for p in a.datasets}
    ref = data[a.datasets[0]]
    env = ref["env"]
    dxy, dz = np.linalg.norm(env[:, 4:6] - env[:, :2], axis=1), env[:, 6] - env[:, 2]
    m = (dxy < 0.01) & (dz < 0.02)  # the expert at its grasp
    fit, out = None, {"reference_roll_fit": None, "datasets": {}}
    if len(np.unique(ref["episode"][m])) >= MIN_FIT:
        x = rule_roll(env[m])
        fit = np.linalg.lstsq(np.stack([x, np.ones_like(x)], 1), ref["state"][m, 4], rcond=None)[0]
        resid = float(np.std(ref["state"][m, 4] - (fit[0] * x + fit[1])))
        out["reference_roll_fit"] = {"slope": round(float(fit[0]), 3), "offset_deg": round(float(fit[1]), 2),
                                     "residual_std_deg": round(resid, 2)}
    else:
        print(f"{a.datasets[0]}: fewer than {MIN_FIT} episodes reach the grasp; no wrist-roll comparison")
    for p, d in data.items():
        rep = report(d, fit)
        out["datasets"][p] = rep
        print(f"{p}: {rep['episodes']} episodes")
        for b in rep["by_distance"]:
            early = "-" if b["ended_early"] is None else f"{b['ended_early']:.0%}"
            print(f"  cube {b['cm'][0]}-{b['cm'][1]} cm from the base: {b['episodes']:4d} episodes, "
                  f"ended early {early}")
        print(f"  at the cube: {rep['at_cube_frames']} frames, labels open the jaws in "
              f"{pct(rep['at_cube_labels_open'])}")
        if rep["near_frames"] is not None:
            print(f"  near the cube: {rep['near_frames']} frames, wrist roll off the expert's rule (p5/p50/p95 deg) "
                  f"{rep['roll_offset_deg_p5_p50_p95']}, beyond 20 deg in {pct(rep['roll_offset_over_20deg'])}")
    emit({"bench": "so101_data", **out}, MEASURES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
