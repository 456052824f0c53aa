"""FP8 planning logic on CPU, with the capability probes monkeypatched (kernels run under `gpu`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from roboloop import availability
from roboloop.training import precision


def test_cpu_auto_is_fp32_and_explicit_fp8_names_the_gap():
    assert precision.plan("auto", "cpu").name == "fp32"
    with pytest.raises(availability.MissingCapability, match="compute capability"):
        precision.plan("fp8", "cpu")


def test_auto_picks_fp8_on_hopper_with_a_backend(monkeypatch):
    monkeypatch.setattr(availability, "cuda_available", lambda: True)
    monkeypatch.setattr(availability, "cuda_capability", lambda: (9, 0))
    monkeypatch.setattr(availability, "has_module", lambda name: name == "torchao")
    p = precision.plan("auto", "cuda", "te")
    assert (p.name, p.fp8_backend) == ("fp8", "torchao")
    with pytest.raises(availability.MissingCapability, match="Transformer Engine is not installed"):
        precision.plan("fp8", "cuda", "te")


def test_auto_falls_back_to_bf16_on_ampere(monkeypatch):
    monkeypatch.setattr(availability, "cuda_available", lambda: True)
    monkeypatch.setattr(availability, "cuda_capability", lambda: (8, 0))
    p = precision.plan("auto", "cuda")
    assert p.name == "bf16" and "8.9" in p.reason


def test_fp8_only_above_break_even():
    keep = precision.fp8_filter(1024)
    assert keep(nn.Linear(2048, 1536), "x")
    assert not keep(nn.Linear(96, 96), "x")
    assert not keep(nn.Linear(2048, 6), "x")


@pytest.mark.gpu
def test_torchao_fp8_linear_close_to_bf16():
    pytest.importorskip("torchao")
    if not availability.fp8_hardware():
        pytest.skip("needs compute capability >= 8.9")
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 2048)).cuda().bfloat16()
    fp8 = nn.Sequential(nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 2048)).cuda().bfloat16()
    fp8.load_state_dict(ref.state_dict())
    n = precision.apply_fp8(fp8, precision.PrecisionPlan("fp8", "test", "torchao"))
    assert n == 2
    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    a, b = ref(x).float(), fp8(x).float()
    assert ((a - b).norm() / a.norm()).item() < 0.1  # FP8 e4m3: a few percent relative error
