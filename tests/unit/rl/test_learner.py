"""The PPO learner and rollout worker, in process (no Ray, no simulator), on a one-step contextual bandit:
the reward is minus the distance of the first executed action from a target the state gives. The learner's
update (GAE, decoupled clipped objective, weights handed to the rollout worker) must raise the mean reward."""

from __future__ import annotations

import pytest
import torch

from roboloop.policies.obs import Obs
from roboloop.rl.config import RLRecipe
from roboloop.rl.workers import Learner, RolloutWorker, Segment
from tests.models import untrained_model


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """Learner(threads=N) sets torch's process-wide thread count; later in-process tests (the bit-identical resume
    check compares an in-process run with a subprocess) must see the default again."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_ppo_updates_raise_the_reward_of_a_contextual_bandit(tmp_path):
    model = untrained_model(tmp_path / "m", state_dim=4, action_dim=2, horizon=4)
    rl = RLRecipe(lr=1e-4, init_std=0.3, x0="zero", minibatch=64, critic_warmup_updates=0).model_dump()
    learner = Learner(str(model), rl, "cpu", 0, threads=1)  # 2 beside another xdist worker: 78 s in make test, 14 alone
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


def test_noise_annealing_reaches_the_rollout_worker_with_the_weights(tmp_path):
    """final_std: the std cap falls log-linearly from init_std to final_std over the budget; it is part of the
    weights the rollout worker receives, so segments are drawn (and scored) with the cap in force."""
    model = untrained_model(tmp_path / "m", state_dim=4, action_dim=2, horizon=4)
    rl = RLRecipe(init_std=0.5, final_std=0.05, x0="zero").model_dump()
    learner = Learner(str(model), rl, "cpu", 0, threads=1)
    rollout = RolloutWorker(str(model), rl, "cpu", 1)
    assert abs(learner.anneal(0.0) - 0.5) < 1e-6 and abs(learner.anneal(1.0) - 0.05) < 1e-6
    assert abs(learner.anneal(0.5) - (0.5 * 0.05) ** 0.5) < 1e-6
    rollout.set_weights(learner.weights(), 1)
    obs = Obs(torch.zeros(4096, 4), {}, ["reach"] * 4096)
    out = rollout.act(obs)
    spread = (out["chain"][:, 1, :4] - out["chain"][:, 1, :4].mean(0)).std()  # x0=zero: one mean per state
    assert abs(float(spread) - (0.5 * 0.05) ** 0.5) < 0.01, spread
    plain = Learner(str(model), RLRecipe(init_std=0.5).model_dump(), "cpu", 0, threads=1)
    assert abs(plain.anneal(1.0) - 0.5) < 1e-6  # no final_std: no schedule
