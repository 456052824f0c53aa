"""Every attention backend against bf16 SDPA on the GPU (skipped without one)."""

from __future__ import annotations

import pytest
import torch

from roboloop import availability
from roboloop.training.attention import cu_seqlens, resolve_backend, varlen_attention

pytestmark = pytest.mark.gpu


def _inputs(dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(0)
    lens = [17, 250, 64, 1, 129]
    cu = cu_seqlens(lens, device="cuda")
    q, k, v = (torch.randn(sum(lens), 8, 64, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    return q, k, v, cu, max(lens)


@pytest.mark.parametrize("backend", ["flash", "torch_varlen"])
def test_backend_matches_sdpa_bf16(backend):
    if backend == "flash" and not availability.flash_attn_available():
        pytest.skip("flash-attn not installed")
    if backend == "torch_varlen" and not availability.torch_varlen_available():
        pytest.skip("PyTorch varlen attention unavailable")
    q, k, v, cu, m = _inputs()
    ref = varlen_attention(q, k, v, cu, cu, m, m, backend="sdpa").float()
    out = varlen_attention(q, k, v, cu, cu, m, m, backend=backend).float()
    # bf16 has 8 mantissa bits: flash kernels differ from SDPA by rounding only.
    assert (out - ref).abs().max().item() < 2e-2
    assert ((out - ref).norm() / ref.norm()).item() < 5e-3


def test_auto_picks_a_varlen_kernel_on_cuda_bf16():
    """flash-attn where it is installed, else PyTorch's varlen kernel (torch 2.11 on a Hopper GPU has it): never the
    padded SDPA fallback on the GPU the trainer is for."""
    want = "flash" if availability.flash_attn_available() else "torch_varlen"
    assert availability.flash_attn_available() or availability.torch_varlen_available(), \
        "neither flash-attn nor PyTorch's varlen attention on this GPU"
    assert resolve_backend("auto", "cuda", torch.bfloat16) == want


def test_sdpa_fp32_on_gpu_matches_cpu():
    q, k, v, cu, m = _inputs(torch.float32)
    gpu = varlen_attention(q, k, v, cu, cu, m, m, backend="sdpa")
    cpu = varlen_attention(q.cpu(), k.cpu(), v.cpu(), cu.cpu(), cu.cpu(), m, m, backend="sdpa")
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-4)
