"""Variable-length attention behind one function.

Packed sequences: tokens of many samples are concatenated into one (T, H, D) tensor and
`cu_seqlens` (N+1,) marks where each sample starts, so no attention crosses samples and
no compute is spent on padding. Backends, fastest first:

  flash        flash_attn.flash_attn_varlen_func (CUDA, flash-attn installed)
  torch_varlen torch.nn.attention.varlen.varlen_attn (CUDA, PyTorch >= 2.10)
  sdpa         F.scaled_dot_product_attention (anywhere): segments are scattered into a
               (N, Lmax) batch with a key mask for the attention only, so its cost is
               N * Lmax^2 rather than (sum L)^2, while every linear layer still runs on the
               packed tokens without padding

`auto` picks the first that can run here and logs the choice and why, once.
Shapes: q_TqHD, k_TkHD, v_TkHD; cu_q/cu_k are int32 cumulative lengths.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Literal

import torch
import torch.nn.functional as F

from roboloop import availability

log = logging.getLogger(__name__)
Backend = Literal["auto", "flash", "torch_varlen", "sdpa"]


def explain_backend(requested: Backend, device_type: str, dtype: torch.dtype) -> tuple[str, str]:
    """(backend, why) for `requested` on this device and input dtype; an explicit backend that cannot run raises."""
    half = dtype in (torch.float16, torch.bfloat16)
    if requested == "auto":
        if device_type == "cuda" and half and availability.flash_attn_available():
            return "flash", "auto: flash-attn is installed and inputs are fp16/bf16 on CUDA"
        if device_type == "cuda" and half and availability.torch_varlen_available():
            return "torch_varlen", "auto: flash-attn not installed; PyTorch varlen flash attention on CUDA"
        reason = "not on CUDA" if device_type != "cuda" else "inputs are fp32" if not half else \
            "no flash-attn and no PyTorch varlen"
        return "sdpa", f"auto: {reason}: SDPA over padded segments"
    if requested == "flash" and not availability.flash_attn_available():
        raise availability.MissingCapability("attention=flash needs flash-attn and a CUDA GPU (pip install "
                                             "--no-build-isolation flash-attn; see docs/guides/gpu.md)")
    if requested == "torch_varlen" and not availability.torch_varlen_available():
        raise availability.MissingCapability("attention=torch_varlen needs a CUDA GPU and PyTorch >= 2.10")
    if requested in ("flash", "torch_varlen") and not half:
        raise availability.MissingCapability(f"attention={requested} needs fp16/bf16 inputs, got {dtype}")
    return requested, "requested"


@cache
def resolve_backend(requested: Backend, device_type: str, dtype: torch.dtype) -> str:
    choice, why = explain_backend(requested, device_type, dtype)
    if requested == "auto":
        log.info("attention backend: %s (%s)", choice, why)
    return choice


@torch.compiler.assume_constant_result
def _traced_resolve(requested: Backend, device_type: str, dtype: torch.dtype) -> str:
    """`resolve_backend`, which torch.compile (train.compile) takes as a constant of the compiled block instead of
    tracing its cache and its checks."""
    return resolve_backend(requested, device_type, dtype)


def block_diagonal_mask(cu_q: torch.Tensor, cu_k: torch.Tensor, total_q: int, total_k: int,
                        causal: bool = False) -> torch.Tensor:
    """(Tq, Tk) bool mask: True where query i and key j belong to the same sample."""
    seg_q = torch.searchsorted(cu_q[1:], torch.arange(total_q, device=cu_q.device), right=True)
    seg_k = torch.searchsorted(cu_k[1:], torch.arange(total_k, device=cu_k.device), right=True)
    mask = seg_q[:, None] == seg_k[None, :]
    if causal:
        pos_q = torch.arange(total_q, device=cu_q.device) - cu_q[seg_q]
        pos_k = torch.arange(total_k, device=cu_k.device) - cu_k[seg_k]
        mask &= pos_q[:, None] >= pos_k[None, :]
    return mask


def varlen_attention(q_TqHD: torch.Tensor, k_TkHD: torch.Tensor, v_TkHD: torch.Tensor, cu_q: torch.Tensor,
                     cu_k: torch.Tensor, max_q: int, max_k: int, causal: bool = False,
                     backend: Backend = "auto") -> torch.Tensor:
    """Attention of packed sequences; returns (Tq, H, D)."""
    which = _traced_resolve(backend, q_TqHD.device.type, q_TqHD.dtype)
    if which == "flash":
        from flash_attn import flash_attn_varlen_func

        return flash_attn_varlen_func(q_TqHD, k_TkHD, v_TkHD, cu_q, cu_k, max_q, max_k, causal=causal)
    if which == "torch_varlen":
        from torch.nn.attention.varlen import varlen_attn

        window = (-1, 0) if causal else (-1, -1)
        return varlen_attn(q_TqHD, k_TkHD, v_TkHD, cu_q, cu_k, max_q, max_k, window_size=window)
    if cu_q.numel() == 2 and cu_k.numel() == 2:  # one sequence (batch-1 inference, export): nothing to pad
        out = F.scaled_dot_product_attention(q_TqHD.transpose(0, 1)[None], k_TkHD.transpose(0, 1)[None],
                                             v_TkHD.transpose(0, 1)[None], is_causal=causal)
        return out[0].transpose(0, 1)
    return _padded_sdpa(q_TqHD, k_TkHD, v_TkHD, cu_q, cu_k, max_q, max_k, causal)


def _segments(cu: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(segment, position within segment) of each packed token."""
    seg = torch.searchsorted(cu[1:], torch.arange(total, device=cu.device), right=True)
    return seg, torch.arange(total, device=cu.device) - cu[seg]


def _padded_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                 max_q: int, max_k: int, causal: bool) -> torch.Tensor:
    n, heads, dim = cu_q.numel() - 1, q.shape[1], q.shape[2]
    sq, pq = _segments(cu_q, q.shape[0])
    sk, pk = _segments(cu_k, k.shape[0])
    qb = q.new_zeros(n, max_q, heads, dim).index_put((sq, pq), q)
    kb = k.new_zeros(n, max_k, heads, dim).index_put((sk, pk), k)
    vb = v.new_zeros(n, max_k, heads, dim).index_put((sk, pk), v)
    lens_k = (cu_k[1:] - cu_k[:-1]).to(torch.long)
    mask = torch.arange(max_k, device=q.device)[None, :] < lens_k[:, None]  # (N, Lk) valid keys
    mask = mask[:, None, None, :]
    if causal:
        mask = mask & (torch.arange(max_q, device=q.device)[:, None] >= torch.arange(max_k, device=q.device))
    out = F.scaled_dot_product_attention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2),
                                         attn_mask=mask)
    return out.transpose(1, 2)[sq, pq]


def cu_seqlens(lengths: list[int] | torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    lens = torch.as_tensor(lengths, dtype=torch.int32, device=device)
    return F.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
