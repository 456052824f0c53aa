"""The gymnasium backend on gym-pusht (LeRobot's standard CPU evaluation env), through the same Evaluator."""

from __future__ import annotations

import pytest
import torch

from roboloop.evaluation.evaluator import evaluate
from roboloop.evaluation.policies import RandomPolicy


def test_pusht_random_policy_counts_episodes(tmp_path):
    pytest.importorskip("gym_pusht")
    from roboloop.sim.gym_env import GymVectorEnv

    with GymVectorEnv("gym_pusht/PushT-v0", num_envs=3, seed=1, max_episode_steps=40) as env:
        obs = env.reset()
        assert obs.state.shape == (3, 2) and obs.images["observation.image"].shape == (3, 96, 96, 3)
        assert obs.images["observation.image"].dtype == torch.uint8 and "T-shaped" in obs.instructions[0]
        assert torch.equal(env.action_low, torch.zeros(2)) and torch.equal(env.action_high, torch.full((2,), 512.0))
        report, trajs = evaluate(env, RandomPolicy(env), episodes=5, execute_steps=4, videos=1,
                                 output_dir=tmp_path, record_rollouts=True)
    assert report.episodes == 5 and report.backend == "gymnasium"
    assert all(len(t["states"]) == 40 for t in trajs)  # truncated by max_episode_steps, auto-reset
    assert report.success_rate == 0.0 and len(report.videos) == 1
