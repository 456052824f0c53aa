"""A GR00T-N1.5-style vision-language-action policy with a flow-matching DiT action head.

Backbone (System 2): camera images -> patch tokens (+ patch and camera embeddings),
instruction -> byte-level tokens, proprioceptive state -> one token; all of a sample's
tokens go through a pre-LN transformer with varlen attention over the packed batch.

Action head (System 1): a DiT over the H action tokens of the chunk. Each block has
AdaLN-Zero conditioning on the flow-matching time t, self-attention among the sample's
action tokens and cross-attention to its backbone tokens. Training is flow matching
(GR00T/pi0 convention): x_t = t * a + (1 - t) * eps, target velocity a - eps, t ~ Beta;
inference integrates K Euler steps from noise.

Legend: T packed backbone tokens, N samples, H horizon, A action dim, D widths.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from roboloop.training.attention import Backend, cu_seqlens, varlen_attention
from roboloop.training.config import ModelConfig
from roboloop.training.packing import PackedBatch
from roboloop.training.vision import KeypointEncoder, keypoint_flops, patchify_flops


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_dim: int | None = None, head_dim: int | None = None):
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim or dim // heads
        inner = self.heads * self.head_dim
        self.q = nn.Linear(dim, inner)
        self.kv = nn.Linear(kv_dim or dim, 2 * inner)
        self.out = nn.Linear(inner, dim)

    def forward(self, x_TD: torch.Tensor, ctx_TD: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                max_q: int, max_k: int, backend: Backend) -> torch.Tensor:
        q = self.q(x_TD).view(-1, self.heads, self.head_dim)
        k, v = self.kv(ctx_TD).view(-1, 2, self.heads, self.head_dim).unbind(1)
        o = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, backend=backend)
        return self.out(o.reshape(x_TD.shape[0], -1))


class Mlp(nn.Module):
    def __init__(self, dim: int, ratio: float = 4.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, int(dim * ratio))
        self.fc2 = nn.Linear(int(dim * ratio), dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class BackboneBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = Mlp(dim)

    def forward(self, x: torch.Tensor, cu: torch.Tensor, max_len: int, backend: Backend) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, cu, cu, max_len, max_len, backend)
        return x + self.mlp(self.ln2(x))


class DiTBlock(nn.Module):
    """AdaLN-Zero DiT block: self-attention over actions, cross-attention to the backbone."""

    def __init__(self, dim: int, heads: int, ctx_dim: int, head_dim: int | None = None):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.ln2 = nn.LayerNorm(dim)
        self.ln3 = nn.LayerNorm(dim, elementwise_affine=False)
        self.self_attn = Attention(dim, heads, head_dim=head_dim)
        self.cross_attn = Attention(dim, heads, kv_dim=ctx_dim, head_dim=head_dim)
        self.mlp = Mlp(dim)
        self.ada = nn.Linear(dim, 6 * dim)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, ctx: torch.Tensor, cu_a: torch.Tensor,
                cu_ctx: torch.Tensor, horizon: int, max_ctx: int, backend: Backend) -> torch.Tensor:
        s1, b1, g1, s2, b2, g2 = self.ada(F.silu(cond)).chunk(6, dim=-1)
        h = self.ln1(x) * (1 + s1) + b1
        x = x + g1 * self.self_attn(h, h, cu_a, cu_a, horizon, horizon, backend)
        x = x + self.cross_attn(self.ln2(x), ctx, cu_a, cu_ctx, horizon, max_ctx, backend)
        h = self.ln3(x) * (1 + s2) + b2
        return x + g2 * self.mlp(h)


def timestep_embedding(t_N: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, device=t_N.device, dtype=torch.float32) / half)
    args = (t_N.float() * 1000.0)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class VLAPolicy(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, dd = cfg.dim, cfg.head_dim_model
        if cfg.vision_encoder:
            from roboloop.training.hf import HFVisionEncoder

            self.vision: nn.Module = HFVisionEncoder(cfg.vision_encoder, d, cfg.tokens_per_image)
        elif cfg.image_encoder == "keypoints":
            self.vision = KeypointEncoder(d, cfg.keypoints)
        else:
            self.patch = nn.Conv2d(3, d, cfg.patch_size, stride=cfg.patch_size)
        self.patch_pos = nn.Parameter(torch.randn(cfg.tokens_per_image, d) * 0.02)
        self.camera_emb = nn.Embedding(cfg.max_cameras, d)
        self.tok_emb = nn.Embedding(cfg.vocab_size, d)
        self.tok_pos = nn.Embedding(cfg.max_text_len, d)
        if cfg.keypoints_to_state and (cfg.image_encoder != "keypoints" or cfg.vision_encoder
                                       or cfg.state_encoder != "mlp"):
            raise ValueError("keypoints_to_state needs image_encoder=keypoints (no vision_encoder) and "
                             "state_encoder=mlp")
        # keypoints_to_state: the state MLP also reads every camera slot's keypoints (zeros for an absent camera)
        self.kp_state_dim = cfg.max_cameras * cfg.keypoints * 3 if cfg.keypoints_to_state else 0
        if cfg.aux_to_state and (not cfg.aux_dim or cfg.state_encoder != "mlp"):
            raise ValueError("aux_to_state needs an auxiliary target (aux_dim > 0) and state_encoder=mlp")
        # aux_to_state: the state MLP also reads every camera slot's auxiliary prediction (zeros for an absent camera)
        self.aux_state_dim = cfg.max_cameras * cfg.aux_dim if cfg.aux_to_state else 0
        if cfg.aux_dim:  # privileged-state head on one image's tokens (see roboloop.training.vision)
            self.aux_head = nn.Sequential(nn.Linear(cfg.tokens_per_image * d, 256), nn.GELU(),
                                          nn.Linear(256, cfg.aux_dim))
        if cfg.state_encoder == "per_dim":  # token j = s_j * w_j + e_j, then a shared MLP
            self.state_dir = nn.Parameter(torch.randn(cfg.state_dim, d) * 0.02)
            self.state_emb = nn.Parameter(torch.randn(cfg.state_dim, d) * 0.02)
            self.state_proj = nn.Sequential(nn.GELU(), nn.Linear(d, d))
        else:
            state_in = cfg.state_dim + self.kp_state_dim + self.aux_state_dim
            self.state_proj = nn.Sequential(nn.Linear(state_in, d), nn.GELU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList([BackboneBlock(d, cfg.heads) for _ in range(cfg.layers)])
        self.ln_out = nn.LayerNorm(d)
        self.action_in = nn.Linear(cfg.action_dim, dd)
        self.action_pos = nn.Parameter(torch.randn(cfg.horizon, dd) * 0.02)
        self.time_mlp = nn.Sequential(nn.Linear(dd, dd), nn.SiLU(), nn.Linear(dd, dd))
        self.head_blocks = nn.ModuleList([
            DiTBlock(dd, cfg.head_heads, ctx_dim=d, head_dim=cfg.head_head_dim) for _ in range(cfg.head_layers)])
        self.ln_head = nn.LayerNorm(dd)
        self.action_out = nn.Linear(dd, cfg.action_dim)

    # ------------------------------------------------------------------ backbone
    def encode(self, b: PackedBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Backbone tokens (T, D) of the packed batch, its cu_seqlens and longest sample."""
        ctx, cu, max_len, _ = self.encode_with_aux(b)
        return ctx, cu, max_len

    def encode_with_aux(self, b: PackedBatch) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor | None]:
        """`encode`, plus each image's auxiliary prediction (I, aux_dim) when the model has an aux head."""
        cfg = self.cfg
        p = cfg.tokens_per_image
        cu = cu_seqlens(b.seq_lens, device=b.states.device)
        total = int(cu[-1])
        x = b.states.new_zeros(total, cfg.dim, dtype=self.patch_pos.dtype)
        aux = None
        kp_state = b.states.new_zeros(b.num_samples, cfg.max_cameras, cfg.keypoints * 3) if self.kp_state_dim else None
        aux_state = b.states.new_zeros(b.num_samples, cfg.max_cameras, cfg.aux_dim) if self.aux_state_dim else None
        if b.images.shape[0]:
            if isinstance(getattr(self, "vision", None), KeypointEncoder):
                kp = self.vision.keypoints(b.image_input(self.patch_pos.dtype))  # (I, K, 3)
                vis = self.vision.tokens(kp)
                if kp_state is not None:
                    kp_state = kp_state.index_put((b.image_sample, b.image_camera), kp.flatten(1).to(kp_state.dtype))
            elif hasattr(self, "vision"):
                vis = self.vision(b.image_input(self.patch_pos.dtype))  # (I, P, D)
            else:
                vis = self.patch(b.image_input(self.patch.weight.dtype)).flatten(2).transpose(1, 2)  # (I, P, D)
            if hasattr(self, "aux_head"):
                aux = self.aux_head(vis.flatten(1))
                if aux_state is not None:  # detached: the flow loss does not move what the head perceives
                    aux_state = aux_state.index_put((b.image_sample, b.image_camera), aux.detach().to(aux_state.dtype))
            vis = vis + self.patch_pos + self.camera_emb(b.image_camera)[:, None]
            start = cu[b.image_sample].long() + b.image_camera * p
            dest = start[:, None] + torch.arange(p, device=start.device)
            x = x.index_put((dest.reshape(-1),), vis.reshape(-1, cfg.dim).to(x.dtype))  # autocast's outputs
        num_images = torch.bincount(b.image_sample, minlength=b.num_samples) if b.images.shape[0] else \
            torch.zeros(b.num_samples, dtype=torch.long, device=x.device)
        if b.tokens.numel():
            txt = self.tok_emb(b.tokens) + self.tok_pos(b.token_pos)
            dest = cu[b.token_sample].long() + num_images[b.token_sample] * p + b.token_pos
            x = x.index_put((dest,), txt.to(x.dtype))
        states = b.states.to(x.dtype)
        extra = [t.flatten(1).to(x.dtype) for t in (kp_state, aux_state) if t is not None]
        if extra:
            states = torch.cat([states, *extra], dim=-1)
        # (CUDA's autocast promotes index_put's source to x's dtype, CPU's does not)
        x = x.index_put((self._state_positions(cu),), self._state_tokens(states).to(x.dtype))
        max_len = int(b.seq_lens.max())
        for blk in self.blocks:
            x = blk(x, cu, max_len, cfg.attention)
        return self.ln_out(x), cu, max_len, aux

    def _state_tokens(self, s_NS: torch.Tensor) -> torch.Tensor:
        """(N * state tokens, D): the last tokens of each sample."""
        if self.cfg.state_encoder == "per_dim":
            tok = s_NS[:, :, None] * self.state_dir + self.state_emb  # (N, S, D)
            return self.state_proj(tok).reshape(-1, self.cfg.dim)
        return self.state_proj(s_NS)

    def _state_positions(self, cu: torch.Tensor) -> torch.Tensor:
        k = self.cfg.num_state_tokens
        return ((cu[1:, None] - k) + torch.arange(k, device=cu.device)).reshape(-1).long()

    # ------------------------------------------------------------------ action head
    def velocity(self, ctx: torch.Tensor, cu_ctx: torch.Tensor, max_ctx: int, x_t: torch.Tensor,
                 t_N: torch.Tensor) -> torch.Tensor:
        """Predicted flow velocity (N, H, A) for noisy chunks x_t at times t."""
        n, h, _ = x_t.shape
        a = (self.action_in(x_t.to(ctx.dtype)) + self.action_pos).reshape(n * h, -1)
        cond = self.time_mlp(timestep_embedding(t_N, self.cfg.head_dim_model).to(ctx.dtype))
        cond = cond.repeat_interleave(h, dim=0)
        cu_a = torch.arange(0, (n + 1) * h, h, device=x_t.device, dtype=torch.int32)
        for blk in self.head_blocks:
            a = blk(a, cond, ctx, cu_a, cu_ctx, h, max_ctx, self.cfg.attention)
        return self.action_out(self.ln_head(a)).view(n, h, -1)

    def loss(self, b: PackedBatch, generator: torch.Generator | None = None, noise: torch.Tensor | None = None,
             u: torch.Tensor | None = None, denominator: float | None = None) -> torch.Tensor:
        """Flow-matching MSE over the valid (unpadded) chunk steps.

        `denominator` (default: this batch's valid steps) lets data-parallel ranks divide by
        the global count, so the mean of rank losses equals the single-process loss.
        """
        err, aux_err = self._errors(b, generator, noise, u)
        mask = b.action_mask.to(err.dtype)
        denom = denominator if denominator is not None else mask.sum().clamp_min(1.0)
        loss = (err * mask).sum() / denom
        if aux_err is not None:
            loss = loss + self.aux_weight * aux_err
            self.last_aux_loss = aux_err.detach()  # logged by the trainer beside the total
        return loss

    aux_weight: float = 0.3  # the trainer sets the recipe's
    last_aux_loss: torch.Tensor | None = None

    def aux_loss(self, aux_pred: torch.Tensor | None, b: PackedBatch) -> torch.Tensor | None:
        """Mean L1 error of each image's privileged-state prediction against its sample's target (normalised)."""
        if aux_pred is None or b.aux.shape[-1] == 0:
            return None
        return (aux_pred.float() - b.aux[b.image_sample].float()).abs().mean()

    def step_errors(self, b: PackedBatch, generator: torch.Generator | None = None,
                    noise: torch.Tensor | None = None, u: torch.Tensor | None = None) -> torch.Tensor:
        """(N, H) squared velocity error per chunk step (padded steps included)."""
        return self._errors(b, generator, noise, u)[0]

    def _errors(self, b: PackedBatch, generator: torch.Generator | None = None, noise: torch.Tensor | None = None,
                u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        ctx, cu, max_len, aux_pred = self.encode_with_aux(b)
        actions = b.actions.to(torch.float32)
        if noise is None:
            noise = torch.randn(actions.shape, generator=generator, device=actions.device)
        if u is None:
            u = torch.rand(actions.shape[0], generator=generator, device=actions.device)
        # GR00T: b ~ Beta(1.5, 1), t = (s - b) / s with s = 0.999, skewing t towards noise.
        # Beta(1.5, 1) has CDF x^1.5, so b = u^(1/1.5) by inversion.
        t = ((0.999 - u.to(actions.device).pow(1 / 1.5)) / 0.999).clamp_min(0.0)
        noise = noise.to(actions.device)
        x_t = t[:, None, None] * actions + (1 - t[:, None, None]) * noise
        v = self.velocity(ctx, cu, max_len, x_t, t).float()
        return ((v - (actions - noise)) ** 2).mean(-1), self.aux_loss(aux_pred, b)

    def forward(self, b: PackedBatch, noise: torch.Tensor, u: torch.Tensor, denominator: float) -> torch.Tensor:
        """The training loss (DDP wraps `forward`, so data-parallel training calls this)."""
        return self.loss(b, noise=noise, u=u, denominator=denominator)

    def initial_chunk(self, n: int, device: torch.device, generator: torch.Generator | None = None,
                      how: str = "sample") -> torch.Tensor:
        """x_0 (N, H, A) of the denoising: a draw from N(0, I), or zeros (`how="zero"`)."""
        shape = (n, self.cfg.horizon, self.cfg.action_dim)
        if how == "zero":
            return torch.zeros(shape, device=device)
        return torch.randn(shape, generator=generator, device=device)

    @torch.no_grad()
    def sample_actions(self, b: PackedBatch, steps: int | None = None, generator: torch.Generator | None = None,
                       x0: torch.Tensor | None = None) -> torch.Tensor:
        """`x0`: the initial chunk (N, H, A) when the caller draws it (per row, from its own keys)."""
        ctx, cu, max_len = self.encode(b)
        n = b.num_samples
        x = x0.to(ctx.device) if x0 is not None else self.initial_chunk(n, ctx.device, generator,
                                                                         self.cfg.initial_noise)
        k = steps or self.cfg.inference_steps
        for i in range(k):
            t = torch.full((n,), i / k, device=ctx.device)
            x = x + self.velocity(ctx, cu, max_len, x, t).float() / k
        return x


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _linear_params(m: nn.Module) -> int:
    return sum(x.in_features * x.out_features for x in m.modules() if isinstance(x, nn.Linear))


def train_flops(cfg: ModelConfig, seq_lens: list[int], num_images: int) -> float:
    """Model FLOPs of one training step (forward + backward = 3x forward) on a packed batch.

    Counts every matmul: linears (2 FLOPs per weight per token they touch; the cross-attention
    key/value projection touches backbone tokens, the rest of the head touches action tokens),
    the patch embedding, and attention scores/values over each sample's own tokens only (what
    varlen attention computes). Embedding lookups, norms and elementwise ops are left out, as
    in the usual MFU definition.
    """
    d, dd, h = cfg.dim, cfg.head_dim_model, cfg.horizon
    t, n = sum(seq_lens), len(seq_lens)
    inner_b = d
    inner_h = cfg.head_heads * (cfg.head_head_dim or dd // cfg.head_heads)
    bb_block = 4 * d * d + 2 * 4 * d * d  # qkv+out, mlp (ratio 4)
    fwd = 2.0 * t * bb_block * cfg.layers
    fwd += 2 * 2 * inner_b * sum(s * s for s in seq_lens) * cfg.layers  # QK^T and PV
    if cfg.image_encoder == "keypoints" and not cfg.vision_encoder:
        fwd += keypoint_flops(num_images, *cfg.image_size, cfg.keypoints, d)
    else:
        fwd += patchify_flops(num_images, cfg.tokens_per_image, cfg.patch_size, d)
    if cfg.state_encoder == "per_dim":
        fwd += 2 * n * cfg.state_dim * (d + d * d)  # per-dimension tokens, shared MLP
    else:
        fwd += 2 * n * (cfg.state_dim * d + d * d)  # state MLP
    per_action = 4 * dd * inner_h + inner_h * dd + inner_h * dd + 2 * 4 * dd * dd + 6 * dd * dd
    # self q/kv/out (4*dd*inner), cross q + out, mlp, adaLN
    fwd += 2 * n * h * per_action * cfg.head_layers
    fwd += 2 * t * d * 2 * inner_h * cfg.head_layers  # cross-attention K/V over backbone tokens
    fwd += 2 * 2 * inner_h * cfg.head_layers * (n * h * h + h * sum(seq_lens))  # self + cross attention
    fwd += 2 * n * h * (2 * cfg.action_dim * dd) + 2 * n * 2 * dd * dd  # action in/out, time MLP
    return 3.0 * fwd
