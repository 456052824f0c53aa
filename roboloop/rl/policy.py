"""The actor-critic RL trains: a VLA with noise-injected denoising and a value head (see `objective`).

Two places for the noise (`noise`):
- `chain` (flow-noise): every denoising step is Gaussian; the chain x_0..x_K is stored.
- `final`: the K steps stay deterministic from x_0 ~ N(0, I) and Gaussian noise is added to the
  executed actions only (the first `executed` chunk positions); x_0 and the executed actions are
  stored (as a 2-entry "chain"). Fewer noisy dimensions, so lower-variance ratios and scores.

`FlowNoisePolicy.sample` draws a chain and returns it with its log-density and V(s);
`FlowNoisePolicy.evaluate` re-scores stored chains under the current weights (the PPO update).
With `freeze_backbone` only the action head, the noise and the value head train; the value head
never back-propagates into the backbone (its features are detached), so critic errors cannot
corrupt what behaviour cloning learned.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from roboloop.rl.objective import LOG_2PI, chain_entropy, chain_log_prob, gaussian_log_prob
from roboloop.training.model import VLAPolicy
from roboloop.training.packing import PackedBatch


def _segment_mean(x_TD: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """(N, D) mean of each packed sample's tokens."""
    lens = (cu[1:] - cu[:-1]).long()
    owner = torch.repeat_interleave(torch.arange(lens.shape[0], device=x_TD.device), lens)
    out = x_TD.new_zeros(lens.shape[0], x_TD.shape[1]).index_add_(0, owner, x_TD)
    return out / lens.clamp_min(1)[:, None].to(x_TD.dtype)


class FlowNoisePolicy(nn.Module):
    def __init__(self, vla: VLAPolicy, denoise_steps: int | None = None, init_std: float = 0.05,
                 min_std: float = 0.01, max_std: float = 0.5, freeze_backbone: bool = False,
                 noise: str = "chain", executed: int | None = None, x0: str = "sample"):
        super().__init__()
        if noise not in ("chain", "final"):
            raise ValueError(f"noise must be 'chain' or 'final', not {noise!r}")
        if x0 not in ("sample", "zero"):
            raise ValueError(f"x0 must be 'sample' or 'zero', not {x0!r}")
        self.vla, self.noise, self.x0 = vla, noise, x0
        self.k = denoise_steps or vla.cfg.inference_steps
        self.executed = min(executed or vla.cfg.horizon, vla.cfg.horizon)
        a = vla.cfg.action_dim
        self.log_std = nn.Parameter(torch.full((self.k if noise == "chain" else 1, a), math.log(init_std)))
        self.min_log, self.max_log = math.log(min_std), math.log(max_std)
        # a schedule's current cap on the std (a buffer: it travels with the weights to the rollout worker)
        self.register_buffer("log_std_cap", torch.tensor(self.max_log))
        d = vla.cfg.dim
        self.value_head = nn.Sequential(nn.Linear(2 * d, d), nn.Tanh(), nn.Linear(d, 1))
        self.freeze_backbone = freeze_backbone
        if freeze_backbone:
            for name, p in vla.named_parameters():
                if not name.startswith(("action_", "time_mlp", "head_blocks", "ln_head")):
                    p.requires_grad_(False)

    def stds(self) -> torch.Tensor:
        """(K, A) (chain) or (1, A) (final) clamped log standard deviations."""
        return torch.minimum(self.log_std.clamp(self.min_log, self.max_log), self.log_std_cap)

    def set_std_cap(self, std: float) -> None:
        self.log_std_cap.fill_(max(self.min_log, min(self.max_log, math.log(std))))

    def _context(self, b: PackedBatch):
        if self.freeze_backbone:
            with torch.no_grad():
                return self.vla.encode(b)
        return self.vla.encode(b)

    def _value(self, ctx: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        """V(s) from the mean of the sample's backbone tokens and its last (state) token, detached."""
        feats = ctx.detach().float()
        return self.value_head(torch.cat([_segment_mean(feats, cu), feats[cu[1:].long() - 1]], -1)).squeeze(-1)

    def _mean(self, ctx, cu, max_len, x: torch.Tensor, k: int) -> torch.Tensor:
        t = torch.full((x.shape[0],), k / self.k, device=x.device)
        return x + self.vla.velocity(ctx, cu, max_len, x, t).float() / self.k

    def _denoise(self, ctx, cu, max_len, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for k in range(self.k):
            x = self._mean(ctx, cu, max_len, x, k)
        return x

    def _final_log_prob(self, actions: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        e = self.executed
        return gaussian_log_prob(actions[:, :e], mean[:, :e], log_std[0]).flatten(1).sum(-1)

    @torch.no_grad()
    def sample(self, b: PackedBatch, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(chain, log-density (N,), value (N,)); the chunk to execute is chain[:, -1].

        chain: (N, K+1, H, A) x_0..x_K (noise `chain`), or (N, 2, H, A) x_0 and the noisy chunk (`final`)."""
        ctx, cu, max_len = self.vla.encode(b)
        x = self.vla.initial_chunk(b.num_samples, ctx.device, generator, self.x0)
        log_std = self.stds()
        if self.noise == "final":
            mean = self._denoise(ctx, cu, max_len, x)
            act = mean.clone()
            eps = torch.randn(act[:, :self.executed].shape, generator=generator, device=act.device)
            act[:, :self.executed] += log_std[0].exp() * eps
            return torch.stack([x, act], 1), self._final_log_prob(act, mean, log_std), self._value(ctx, cu)
        chain, means = [x], []
        for k in range(self.k):
            mu = self._mean(ctx, cu, max_len, x, k)
            noise = torch.randn(mu.shape, generator=generator, device=mu.device)
            x = mu + log_std[k].exp() * noise
            chain.append(x)
            means.append(mu)
        c, m = torch.stack(chain, 1), torch.stack(means, 1)
        return c, chain_log_prob(c, m, log_std), self._value(ctx, cu)

    def evaluate(self, b: PackedBatch, chain_NKHA: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log-density of `chain` under the current weights (N,), entropy (scalar), value (N,))."""
        ctx, cu, max_len = self._context(b)
        log_std = self.stds()
        if self.noise == "final":
            mean = self._denoise(ctx, cu, max_len, chain_NKHA[:, 0])
            entropy = self.executed * (log_std[0] + 0.5 * (1 + LOG_2PI)).sum()
            return self._final_log_prob(chain_NKHA[:, 1], mean, log_std), entropy, self._value(ctx, cu)
        means = torch.stack([self._mean(ctx, cu, max_len, chain_NKHA[:, k], k) for k in range(self.k)], 1)
        return (chain_log_prob(chain_NKHA, means, log_std), chain_entropy(log_std, self.vla.cfg.horizon),
                self._value(ctx, cu))

    @torch.no_grad()
    def value(self, b: PackedBatch) -> torch.Tensor:
        ctx, cu, _ = self.vla.encode(b)
        return self._value(ctx, cu)
