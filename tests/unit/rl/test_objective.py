"""Flow-noise PPO by hand: GAE, the decoupled clipped objective, the chain log-likelihood (and Monte Carlo)."""

from __future__ import annotations

import math

import torch

from roboloop.rl.objective import chain_entropy, chain_log_prob, gae, ppo_loss
from roboloop.rl.policy import FlowNoisePolicy
from roboloop.training.config import tiny
from roboloop.training.model import VLAPolicy
from roboloop.training.packing import Sample, collate


def test_gae_by_hand():
    # one env, 3 decisions, gamma 0.9, lambda 0.5; the episode ends during decision 1
    r = torch.tensor([[1.0], [2.0], [0.5]])
    v = torch.tensor([[0.5], [1.0], [2.0]])
    d = torch.tensor([[False], [True], [False]])
    adv, ret = gae(r, v, d, torch.tensor([4.0]), gamma=0.9, lam=0.5)
    d2 = 0.5 + 0.9 * 4.0 - 2.0          # 2.1
    d1 = 2.0 - 1.0                      # 1.0 (terminal: no bootstrap, no carry)
    d0 = 1.0 + 0.9 * 1.0 - 0.5          # 1.4
    expect = torch.tensor([[d0 + 0.45 * d1], [d1], [d2]])
    assert torch.allclose(adv, expect)
    assert torch.allclose(ret, expect + v)


def test_clipped_objective_by_hand():
    logp_prox = torch.zeros(3)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1]))  # ratios 1.5, 0.5, 1.1
    adv = torch.tensor([1.0, -2.0, 3.0])
    behav = torch.log(torch.tensor([1.0, 1.0, 0.25]))  # third sample: prox / behav = 4, capped at 2
    t = ppo_loss(logp, logp_prox, behav, adv, value=torch.zeros(3), returns=torch.ones(3),
                 entropy=torch.tensor(0.0), clip=0.2, is_cap=2.0)
    # min(r A, clip(r) A): 1.2 * 1 = 1.2; min(0.5 * -2, 0.8 * -2) = -1.6; 2 * min(1.1 * 3, 1.1 * 3) = 6.6
    assert math.isclose(t.policy.item(), -(1.2 - 1.6 + 6.6) / 3, rel_tol=1e-6)
    assert math.isclose(t.value.item(), 0.5, rel_tol=1e-6)
    assert math.isclose(t.clip_fraction.item(), 2 / 3, rel_tol=1e-6)
    # gradient only where the unclipped term is the minimum: d/dlogp of -(w r A)/3 = -(2 * 1.1 * 3)/3 for sample 3
    lp = logp.clone().requires_grad_(True)
    ppo_loss(lp, logp_prox, behav, adv, torch.zeros(3), torch.zeros(3), torch.tensor(0.0)).policy.backward()
    assert torch.allclose(lp.grad, torch.tensor([0.0, 0.0, -2 * 1.1 * 3 / 3]), atol=1e-6)


def test_chain_log_prob_by_hand():
    chain = torch.tensor([0.0, 0.3, -0.1]).reshape(1, 3, 1, 1)  # x0, x1, x2 (K = 2, H = A = 1)
    means = torch.tensor([0.1, 0.2]).reshape(1, 2, 1, 1)
    log_std = torch.log(torch.tensor([[0.5], [0.25]]))
    lp = chain_log_prob(chain, means, log_std)

    def n(x, m, s):
        return -0.5 * ((x - m) / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)
    assert math.isclose(lp.item(), n(0.3, 0.1, 0.5) + n(-0.1, 0.2, 0.25), rel_tol=1e-6)
    assert math.isclose(chain_entropy(log_std, horizon=3).item(),
                        3 * sum(0.5 * math.log(2 * math.pi * math.e * s * s) for s in (0.5, 0.25)), rel_tol=1e-6)


def _linear_policy(a: float, b: float, std: float, k: int = 3) -> tuple[FlowNoisePolicy, object]:
    """A policy whose velocity field is v(x, t) = -a x + b: every step is affine plus Gaussian noise, so the
    chunk's marginal law is Gaussian and known in closed form."""
    cfg = tiny(state_dim=2, action_dim=2, horizon=2, inference_steps=k)
    pol = FlowNoisePolicy(VLAPolicy(cfg), init_std=std)
    pol.vla.velocity = lambda ctx, cu, max_len, x, t: -a * x + b  # type: ignore[method-assign]
    batch = collate([Sample([], torch.tensor([1, 2, 3]), torch.zeros(2), torch.zeros(2, 2),
                            torch.ones(2, dtype=torch.bool))], cfg.tokens_per_image)
    return pol, batch


def test_log_likelihood_matches_monte_carlo():
    """Two Monte Carlo checks of the noise-injected likelihood against closed forms (linear velocity field):
    (1) the average log-density of sampled chains is minus the transition entropy (the sampler draws from the
    density `chain_log_prob` scores); (2) the chunk's marginal log-density, estimated by averaging the last
    step's Gaussian over sampled prefixes, matches the Gaussian the affine recursion gives. Tolerance 0.02 nats
    with 20,000 samples (standard errors ~0.01 and ~0.003)."""
    a, b, std, k = 0.6, 0.3, 0.2, 3
    pol, batch = _linear_policy(a, b, std, k)
    g = torch.Generator().manual_seed(0)
    n = 20_000
    big = collate([Sample([], torch.tensor([1, 2, 3]), torch.zeros(2), torch.zeros(2, 2),
                          torch.ones(2, dtype=torch.bool))] * n, pol.vla.cfg.tokens_per_image)
    chain, logp, _ = pol.sample(big, generator=g)
    assert abs(logp.mean().item() + chain_entropy(pol.stds(), 2).item()) < 0.02 * 4
    lp_eval, _, _ = pol.evaluate(big, chain)
    assert torch.allclose(lp_eval, logp, atol=1e-4)  # re-scoring a chain reproduces its sampling density

    # marginal of one coordinate of x_K at a fixed point y, by Monte Carlo over prefixes x_{K-1}
    c = 1 - a / k
    m, var = 0.0, 1.0
    for _ in range(k):
        m, var = c * m + b / k, c * c * var + std * std
    y = 0.4
    analytic = -0.5 * (y - m) ** 2 / var - 0.5 * math.log(2 * math.pi * var)
    prev = chain[:, k - 1, 0, 0]
    mu = prev + (-a * prev + b) / k
    dens = torch.exp(-0.5 * ((y - mu) / std) ** 2) / (std * math.sqrt(2 * math.pi))
    mc = math.log(dens.double().mean().item())
    assert abs(mc - analytic) < 0.02, (mc, analytic)


def test_frozen_backbone_trains_only_the_head_noise_and_value():
    pol = FlowNoisePolicy(VLAPolicy(tiny(state_dim=2, action_dim=2, horizon=2)), freeze_backbone=True)
    trainable = {n for n, p in pol.named_parameters() if p.requires_grad}
    assert "log_std" in trainable and any(n.startswith("value_head") for n in trainable)
    assert any(n.startswith("vla.head_blocks") for n in trainable)
    assert not any(n.startswith(("vla.blocks", "vla.tok_emb", "vla.state_proj")) for n in trainable)


def test_final_noise_scores_only_the_executed_actions():
    """`final` noise: deterministic denoising from x_0, Gaussian noise on the first `executed` positions only.
    By hand on a linear field; Monte Carlo: the mean log-density of sampled chunks is minus their entropy."""
    a, b, std, k = 0.6, 0.3, 0.2, 3
    cfg = tiny(state_dim=2, action_dim=2, horizon=4, inference_steps=k)
    pol = FlowNoisePolicy(VLAPolicy(cfg), init_std=std, noise="final", executed=2)
    pol.vla.velocity = lambda ctx, cu, max_len, x, t: -a * x + b  # type: ignore[method-assign]
    n = 20_000
    big = collate([Sample([], torch.tensor([1, 2, 3]), torch.zeros(2), torch.zeros(4, 2),
                          torch.ones(4, dtype=torch.bool))] * n, cfg.tokens_per_image)
    chain, logp, _ = pol.sample(big, generator=torch.Generator().manual_seed(0))
    assert chain.shape == (n, 2, 4, 2)
    x0, act = chain[:, 0], chain[:, 1]
    mean = x0
    for _ in range(k):
        mean = mean + (-a * mean + b) / k
    assert torch.allclose(act[:, 2:], mean[:, 2:], atol=1e-6)  # positions not executed carry no noise
    z = (act[:, :2] - mean[:, :2]) / std
    by_hand = (-0.5 * z ** 2 - math.log(std) - 0.5 * math.log(2 * math.pi)).flatten(1).sum(-1)
    assert torch.allclose(logp, by_hand, atol=1e-4)
    lp, ent, _ = pol.evaluate(big, chain)
    assert torch.allclose(lp, logp, atol=1e-4)
    assert math.isclose(ent.item(), 2 * 2 * (math.log(std) + 0.5 * (1 + math.log(2 * math.pi))), rel_tol=1e-5)
    assert abs(logp.mean().item() + ent.item()) < 0.05  # 4 dims, standard error ~0.014


def test_x0_zero_makes_a_gaussian_policy_around_one_chunk_and_the_model_acts_from_it():
    """x0=zero: denoising starts at 0, so the only randomness is the scored noise (its log-density is re-scored
    exactly); a model whose config says initial_noise=zero acts from the same deterministic chunk."""
    cfg = tiny(state_dim=2, action_dim=2, horizon=4, inference_steps=3)
    torch.manual_seed(0)
    vla = VLAPolicy(cfg)
    pol = FlowNoisePolicy(vla, init_std=0.2, noise="final", executed=2, x0="zero")
    b = collate([Sample([], torch.tensor([1, 2, 3]), torch.randn(2), torch.zeros(4, 2),
                        torch.ones(4, dtype=torch.bool)) for _ in range(5)], cfg.tokens_per_image)
    c1, lp1, _ = pol.sample(b, generator=torch.Generator().manual_seed(1))
    c2, _, _ = pol.sample(b, generator=torch.Generator().manual_seed(2))
    assert c1[:, 0].abs().sum() == 0 and c2[:, 0].abs().sum() == 0
    torch.testing.assert_close(c1[:, 1, 2:], c2[:, 1, 2:])  # unexecuted positions: the deterministic chunk
    assert not torch.allclose(c1[:, 1, :2], c2[:, 1, :2])  # executed ones: noisy
    lp, _, _ = pol.evaluate(b, c1)
    torch.testing.assert_close(lp, lp1, atol=1e-4, rtol=0)
    vla.eval()
    acting = VLAPolicy(cfg.model_copy(update={"initial_noise": "zero"}))
    acting.load_state_dict(vla.state_dict())
    a1 = acting.sample_actions(b, generator=torch.Generator().manual_seed(1))
    a2 = acting.sample_actions(b, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(a1, a2)
    torch.testing.assert_close(a1[:, 2:], c1[:, 1, 2:])  # the same chunk the RL policy is centred on
    sampled = vla.sample_actions(b, generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(sampled, a1)  # the default still draws x_0
