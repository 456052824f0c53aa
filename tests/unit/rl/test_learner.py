"""The PPO learner and rollout worker, in process (no Ray, no simulator), on a one-step contextual bandit:
the reward is minus the distance of the first executed action from a target the state gives. The learner's
update (GAE, decoupled clipped objective, weights handed to the rollout worker) must raise the mean reward."""

from __future__ import annotations

import torch

from roboloop.evaluation.protocol import Obs
from roboloop.rl.config import RLRecipe
from roboloop.rl.workers import Learner, RolloutWorker, Segment
from tests.models import untrained_model


def test_ppo_updates_raise_the_reward_of_a_contextual_bandit(tmp_path):
    model = untrained_model(tmp_path / "m", state_dim=4, action_dim=2, horizon=4)
    rl = RLRecipe(lr=1e-4, init_std=0.3, x0="zero", minibatch=64, critic_warmup_updates=0).model_dump()
    learner = Learner(str(model), rl, "cpu", 0, threads=2)
    rollout = RolloutWorker(str(model), rl, "cpu", 1)
    g = torch.Generator().manual_seed(0)
    n, t_len = 64, 4
    mean_reward = []
    for _ in range(20):
        obs, chains, logps, rewards, versions = [], [], [], [], []
        for _ in range(t_len):
            s = torch.randn(n, 4, generator=g)
            o = Obs(s, {}, ["reach"] * n)
            out = rollout.act(o)
            rewards.append(-(out["actions"][:, 0] - s[:, :2]).norm(dim=-1))
            obs.append(o)
            chains.append(out["chain"])
            logps.append(out["logp"])
            versions.append(out["version"])
        seg = Segment(0, obs, obs[-1], torch.stack(chains), torch.stack(logps), torch.tensor(versions),
                      torch.stack(rewards), torch.ones(t_len, n, dtype=torch.bool), t_len * n, t_len * n, 0)
        m = learner.update([seg])
        assert m["staleness_max"] == 0 and m["version"] == len(mean_reward) + 1
        rollout.set_weights(learner.weights(), m["version"])
        mean_reward.append(torch.stack(rewards).mean().item())
    first, last = sum(mean_reward[:3]) / 3, sum(mean_reward[-3:]) / 3
    assert last > first + 0.4, mean_reward  # measured: -1.81 -> -1.07 (one update's noise: ~0.05)
