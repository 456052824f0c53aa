"""What RL fine-tuning optimises: PPO on the flow-matching head made stochastic by injected noise.

**The policy.** The behaviour-cloned VLA samples an action chunk by K Euler steps from noise,
x_{k+1} = x_k + v_theta(x_k, t_k | s) / K with x_0 ~ N(0, I). That map is deterministic given
x_0, and the density of its output has no closed form, so a likelihood-ratio gradient cannot
be taken through it. Flow-noise (ReinFlow, Zhang et al. 2025; pi_RL's flow-noise, RLinf)
adds learnable Gaussian noise to every step:

    x_{k+1} = mu_k + sigma_k * eps_k,   mu_k = x_k + v_theta(x_k, t_k | s) / K,   eps_k ~ N(0, I)

so each step is a Gaussian transition and the whole denoising chain c = (x_0, ..., x_K) has
the tractable density

    log pi_theta(c | s) = log N(x_0; 0, I) + sum_k sum_{h,a} log N(x_{k+1,h,a}; mu_{k,h,a}, sigma_{k,a}^2).

The first term does not depend on theta and is left out (it cancels in every ratio). sigma_k
is a learnable standard deviation per step and action dimension (`log_std`, clamped to
[min_std, max_std]). With `noise=final` (the default) the chain is x_0 and the executed actions,
drawn around the deterministic denoising from x_0 (same argument, one Gaussian step). Its initial
std (`init_std`, 1.0 normalised units, i.e. one standard deviation of the demonstrations' actions)
is large on purpose: PPO's trust region (clip, target KL) lets the mean move by a fraction of sigma
per update, and the exploration signal grows with sigma, while the evaluated (and published) policy
is the noise-free mean. On the reach bench (400k env steps from a 35% policy) sigma 0.5 gained 25
points and 1.0 gained 35; 0.1 lost 6 points in 150k steps, and annealing 0.5 -> 0.1 gained only 8.

**Why the gradient is a valid policy gradient.** Treat the whole chain c as the action of an
augmented MDP: the environment only reads the chunk x_K (its first `execute_steps` actions),
so transitions and rewards are functions of (s, c), and pi_theta(c | s) is a proper density
over c. The policy-gradient theorem then holds for the augmented MDP exactly as for any
stochastic policy: grad J = E[sum_t grad log pi_theta(c_t | s_t) A(s_t, c_t)], and J is the
same return as that of the marginal policy over chunks. No approximation of the chunk's
marginal likelihood is involved; the noise only has to stay > 0 (hence min_std).

**Where x_0 comes from** (`x0`). Drawn from N(0, I) as behaviour cloning samples, x_0 is part of
the chain but its density does not depend on theta, so which mode of the cloned distribution it
picks (which ball, say) is exploration the gradient never credits: only the scored noise is. With
`x0=zero` the denoising starts at 0, the policy is a Gaussian around one deterministic chunk
(classic PPO for a continuous policy) and all its exploration is scored; the published model then
acts from 0 too (`ModelConfig.initial_noise`), so what is evaluated is what was trained.

**What is optimised** (per decision t of an env, i.e. one executed chunk):
- reward r_t = sum_{i < E} gamma^i r_{t,i} over the E executed env steps, discount gamma^E
  between decisions (a semi-MDP), no bootstrap across an episode's end. r_{t,i} is the task's
  reward (`reward=task`; Roboloop-Reach: -distance to the named ball every step, +5 on success)
  or, on the Roboloop-Reach tasks by default, its progress form (`reward=progress`): the decrease
  of that distance during the step in units of the end-effector step, +5 on success. That is
  potential-based shaping (Ng et al. 1999, potential -distance / ee_step); undiscounted, an
  episode's rewards sum to the distance it closed plus the bonus. Why it matters: with -distance,
  an action's effect (a few mm) is a tiny change on top of a level set by the state, which the
  critic must predict to within that change; with progress, the effect is the reward itself, and a
  short horizon (gamma 0.5 per step by default) credits each decision mostly for its own progress.
  Greedy progress toward the named ball is what solves the reach task (no obstacles), so the
  short horizon costs nothing there;
- advantages by GAE(gamma^E, lambda) on rewards scaled by `reward_scale`, with a value head V_phi(s)
  (an MLP on the mean and the last (state) token of the backbone, see `roboloop.rl.policy`),
  normalised per update;
- the clipped surrogate (PPO) on the chain's likelihood ratio, with the decoupled correction
  of asynchronous PPO (AReaL, Fu et al. 2025) for data made by an older weights version:
  ratio r = pi_theta / pi_prox (pi_prox: the learner's weights when the update began) is
  clipped, and the sample is weighted by w = min(pi_prox / pi_behav, is_cap), the truncated
  importance ratio to the version that generated it. With fresh data pi_prox = pi_behav and
  this is PPO exactly;
- value loss 0.5 (V - R)^2 on the GAE returns, an entropy bonus on the per-step Gaussian
  entropies (it acts on sigma only), and early stop of the epochs at a target approximate KL.
  The policy's and the critic's gradients are clipped separately: the critic's, large while it
  learns the returns, would otherwise shrink the policy's step through a shared global norm.

Legend: N decisions, K denoising steps, H horizon, A action dim, T decisions per env segment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LOG_2PI = math.log(2 * math.pi)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, exp(log_std)^2)."""
    return -0.5 * ((x - mean) / log_std.exp()) ** 2 - log_std - 0.5 * LOG_2PI


def chain_log_prob(chain_NKHA: torch.Tensor, means_NKHA: torch.Tensor, log_std_KA: torch.Tensor) -> torch.Tensor:
    """(N,) log-density of denoising chains: chain[:, k+1] ~ N(means[:, k], sigma_k^2) for k < K.

    `chain` holds x_0..x_K (K+1 entries along dim 1), `means` mu_0..mu_{K-1} (K entries)."""
    lp = gaussian_log_prob(chain_NKHA[:, 1:], means_NKHA, log_std_KA[None, :, None, :])
    return lp.flatten(1).sum(-1)


def chain_entropy(log_std_KA: torch.Tensor, horizon: int) -> torch.Tensor:
    """Sum over steps, chunk positions and dimensions of the transition Gaussians' entropies."""
    return horizon * (log_std_KA + 0.5 * (1 + LOG_2PI)).sum()


def gae(rewards_TN: torch.Tensor, values_TN: torch.Tensor, dones_TN: torch.Tensor, last_value_N: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over T decisions of N envs.

    `dones[t]`: the episode ended during decision t (no bootstrap from t+1). `last_value`: V of
    the observation after the last decision. Returns (advantages, returns = advantages + values)."""
    t_len = rewards_TN.shape[0]
    adv = torch.zeros_like(rewards_TN)
    running = torch.zeros_like(last_value_N)
    for t in reversed(range(t_len)):
        nxt = last_value_N if t == t_len - 1 else values_TN[t + 1]
        live = 1.0 - dones_TN[t].float()
        delta = rewards_TN[t] + gamma * nxt * live - values_TN[t]
        running = delta + gamma * lam * live * running
        adv[t] = running
    return adv, adv + values_TN


@dataclass
class PPOTerms:
    loss: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clip_fraction: torch.Tensor


def ppo_loss(logp: torch.Tensor, logp_prox: torch.Tensor, logp_behav: torch.Tensor, adv: torch.Tensor,
             value: torch.Tensor, returns: torch.Tensor, entropy: torch.Tensor, clip: float = 0.2,
             is_cap: float = 2.0, value_coef: float = 0.5, entropy_coef: float = 0.0) -> PPOTerms:
    """Decoupled clipped surrogate (see the module docstring); all inputs (N,) but `entropy` (scalar)."""
    ratio = torch.exp(logp - logp_prox)
    w = torch.exp(logp_prox - logp_behav).clamp(max=is_cap).detach()
    surr = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    policy = -(w * surr).mean()
    value_loss = 0.5 * ((value - returns) ** 2).mean()
    loss = policy + value_coef * value_loss - entropy_coef * entropy
    with torch.no_grad():
        log_r = logp - logp_prox
        approx_kl = ((log_r.exp() - 1) - log_r).mean()  # Schulman's k3 estimator of KL(prox || theta)
        clip_fraction = ((ratio - 1).abs() > clip).float().mean()
    return PPOTerms(loss, policy, value_loss, entropy, approx_kl, clip_fraction)
