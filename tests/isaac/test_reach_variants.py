"""The reach task's variants: end-effector actions (default), joint actions, and the vision-only state."""

from __future__ import annotations

import pytest

from tests.isaac.test_reach_task import roboloop

pytestmark = pytest.mark.isaac


@pytest.mark.parametrize("task, state_dim, actions", [
    ("Roboloop-Reach-Color-Joint-v0", 18, ["d_shoulder", "d_elbow"]),
    ("Roboloop-Reach-Color-Vision-v0", 4, ["d_tip_x", "d_tip_y"]),
])
def test_variant_expert_solves_it_and_collect_records_its_features(tmp_path, task, state_dim, actions):
    from roboloop.datasets.meta import load_meta

    r = roboloop("collect", str(tmp_path / "demos"), "--task", task, "--episodes", "8", "--num-envs", "8")
    assert r["expert_success_rate"] >= 0.95, r
    meta = load_meta(tmp_path / "demos")
    feats = meta.info.features
    assert list(feats["observation.state"].shape) == [state_dim]
    assert list(feats["action"].names) == actions
    if task.endswith("-Vision-v0"):  # the privileged scene state is recorded beside (never inside) the state
        _check_environment_state(tmp_path / "demos", meta)
    else:
        assert "observation.environment_state" not in feats
    rand = roboloop("evaluate", "--task", task, "--policy", "random", "--episodes", "8", "--num-envs", "8",
                    "--videos", "0", "--output-dir", str(tmp_path / "r"))
    assert rand["success_rate"] <= 0.25, rand


def _check_environment_state(root, meta) -> None:
    """observation.environment_state holds the true ball and fingertip positions: the clean EE expert's recorded
    action is exactly its command toward the named ball computed from them."""
    import numpy as np
    import pyarrow.parquet as pq

    feat = meta.info.features["observation.environment_state"]
    assert list(feat.names) == ["red_x", "red_y", "green_x", "green_y", "blue_x", "blue_y", "tip_x", "tip_y"]
    for ep in meta.episodes[:4]:
        path = root / meta.info.data_path.format(episode_chunk=0, episode_index=ep.episode_index)
        t = pq.read_table(path).to_pydict()
        env, action = np.array(t["observation.environment_state"]), np.array(t["action"])
        colour = next(i for i, c in enumerate(["red", "green", "blue"]) if c in meta.tasks[t["task_index"][0]])
        v = (env[:, 2 * colour: 2 * colour + 2] - env[:, 6:8]) / 0.10
        np.testing.assert_allclose(action, v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1.0), atol=1e-4)


def test_dagger_collection_records_the_experts_labels_at_the_states_another_policy_visits(tmp_path):
    """`collect --policy P`: P acts (here random), every visited state is kept with the expert's action there."""
    import numpy as np
    import pyarrow.parquet as pq

    from roboloop.datasets.meta import load_meta

    r = roboloop("collect", str(tmp_path / "dagger"), "--policy", "random", "--episodes", "8", "--num-envs", "8")
    assert r["actor"] == "random" and r["episodes"] == 8
    meta = load_meta(tmp_path / "dagger")
    assert meta.info.total_episodes == 8  # failures are kept: they are where the labels matter
    colours = ["red", "green", "blue"]
    checked = 0
    for ep in meta.episodes:
        path = tmp_path / "dagger" / meta.info.data_path.format(episode_chunk=0, episode_index=ep.episode_index)
        t = pq.read_table(path).to_pydict()
        state, action = np.array(t["observation.state"]), np.array(t["action"])
        colour = next(i for i, c in enumerate(colours) if c in meta.tasks[t["task_index"][0]])
        goal, tip = state[:, 6 + 2 * colour: 8 + 2 * colour], state[:, 4:6]
        v = (goal - tip) / 0.10  # the EE expert: error over its linear zone, norm capped at 1
        want = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1.0)
        np.testing.assert_allclose(action, want, atol=1e-4)
        moved = np.abs(np.diff(state[:, :2], axis=0)).sum(1)
        checked += len(state)
        assert not np.allclose(action[1:][moved > 0.01], 0.0)
    assert checked > 8 * 20  # random rarely succeeds: long episodes, far from the expert's own path


def test_episodes_counted_do_not_depend_on_num_envs_and_never_replay_a_demo_layout(tmp_path):
    """Episode k plays layout k whatever the batch size (same outcomes for a deterministic policy); collection
    records on the train split of layouts, evaluation plays the test split."""
    import json

    import numpy as np
    import pyarrow.parquet as pq

    from roboloop.datasets.meta import load_meta

    runs = {}
    for n in (3, 8):  # the 8-env run also saves its rollouts (the test split) for the layout check below
        extra = ["--save-rollouts", str(tmp_path / "ro")] if n == 8 else []
        roboloop("evaluate", "--policy", "expert", "--episodes", "8", "--num-envs", str(n), "--videos", "0",
                 "--execute-steps", "1", "--output-dir", str(tmp_path / f"e{n}"), *extra)
        per = json.loads((tmp_path / f"e{n}" / "report.json").read_text())["per_episode"]
        runs[n] = sorted((e["length"], e["success"]) for e in per)
    assert runs[3] == runs[8], runs
    roboloop("collect", str(tmp_path / "demos"), "--episodes", "8", "--num-envs", "8")
    firsts = []
    for root in (tmp_path / "demos", tmp_path / "ro"):
        meta = load_meta(root)
        rows = []
        for ep in meta.episodes:
            files = sorted(root.glob(f"data/**/episode_{ep.episode_index:06d}.parquet")) or sorted(
                root.glob("data/**/*.parquet"))
            t = pq.read_table(files[0]).to_pydict()
            idx = [i for i, e in enumerate(t["episode_index"]) if e == ep.episode_index][0]
            rows.append(np.round(np.asarray(t["observation.state"][idx][6:12]), 4))  # the ball layout
        firsts.append({tuple(r) for r in rows})
    assert not firsts[0] & firsts[1]



PROGRESS_SCRIPT = r"""
import json, sys, torch
from roboloop.sim.isaac import IsaacLabEnv
from roboloop.sim.isaac_tasks.controllers import fingertip
env = IsaacLabEnv("Roboloop-Reach-Color-v0", num_envs=4, camera=False, overrides={"reward_mode": "progress"})
env.reset(seed=3)
e = env.env.unwrapped
d0 = e._distance().clone()
ret, ended, out = torch.zeros(4), torch.zeros(4, dtype=torch.bool), []
while not ended.all():
    res = env.step(e.expert_action().cpu())
    ret += torch.where(ended, torch.zeros(4), res.reward)
    out += [{"ret": float(ret[i]), "d0": float(d0[i]), "success": bool(res.success[i])}
            for i in torch.nonzero(res.done & ~ended).flatten().tolist()]
    ended |= res.done
# the envs that have just auto-reset measure their next step's progress from their new episode's start
last = res.done.to(e.device)
start = torch.linalg.norm(fingertip(e.start_q.to(e.device)) - e.goal(), dim=-1)
print(json.dumps({"episodes": out, "reset_gap": float((e.last_distance - start)[last].abs().max()),
                  "radius": e.cfg.success_radius, "ee_step": e.cfg.ee_step, "bonus": e.cfg.success_bonus}))
"""


def test_progress_reward_telescopes_to_the_distance_covered():
    """reward_mode=progress (what RL trains on): an episode's rewards sum to (start distance - end distance) / ee_step
    plus the success bonus, and an auto-reset env's next progress starts from its new episode's distance."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", PROGRESS_SCRIPT], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(r["episodes"]) == 4 and r["reset_gap"] < 1e-4, r
    for ep in r["episodes"]:
        assert ep["success"], ep
        covered = ep["ret"] - r["bonus"]  # (d0 - d_end) / ee_step with 0 <= d_end < success_radius
        assert (ep["d0"] - r["radius"]) / r["ee_step"] - 1e-3 < covered <= ep["d0"] / r["ee_step"] + 1e-3, (ep, r)
