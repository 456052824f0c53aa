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


def test_auto_picks_fp8_only_where_fp8_was_measured_faster_on_that_gpu(monkeypatch, tmp_path):
    import json

    monkeypatch.setenv("ROBOLOOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(availability, "cuda_available", lambda: True)
    monkeypatch.setattr(availability, "cuda_capability", lambda: (9, 0))
    monkeypatch.setattr(availability, "has_module", lambda name: name == "torchao")
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    p = precision.plan("auto", "cuda", "te", gpu_name=h200)  # nothing measured yet
    assert p.name == "bf16" and "not measured faster eager on NVIDIA H200" in p.reason and "--grid" in p.reason
    (tmp_path / precision.FP8_THRESHOLDS_FILE).write_text(json.dumps({h100: 2048, h200: None}))
    p = precision.plan("auto", "cuda", "te", gpu_name=h200)  # measured: never faster
    assert p.name == "bf16" and "slower than bf16 eager at every width on NVIDIA H200" in p.reason
    p = precision.plan("auto", "cuda", "te", gpu_name=h100)
    assert (p.name, p.fp8_backend) == ("fp8", "torchao") and "from 2048 features" in p.reason
    # a run that compiles its blocks reads the grid measured compiled: none recorded for the H100 yet
    p = precision.plan("auto", "cuda", "torchao", gpu_name=h100, compiled=True)
    assert p.name == "bf16" and "--grid --compile" in p.reason
    (tmp_path / precision.FP8_THRESHOLDS_FILE).write_text(json.dumps({h200: None, f"{h200}|compiled": 1024}))
    p = precision.plan("auto", "cuda", "torchao", gpu_name=h200, compiled=True)
    assert p.name == "fp8" and "faster compiled on NVIDIA H200 from 1024 features" in p.reason
    assert precision.plan("auto", "cuda", "torchao", gpu_name=h200).name == "bf16"  # eager: never faster
    assert precision.plan("fp8", "cuda", "torchao", gpu_name=h200).name == "fp8"  # an explicit fp8 is honoured
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


def _hopper_with_torchao(monkeypatch):
    monkeypatch.setattr(availability, "cuda_available", lambda: True)
    monkeypatch.setattr(availability, "cuda_capability", lambda: (9, 0))
    monkeypatch.setattr(availability, "has_module", lambda name: name == "torchao")


def test_fp8_converting_no_linear_is_bf16_under_auto_refused_if_asked_and_base_converts_its_large_ones(monkeypatch):
    from roboloop.training.config import base, small
    from roboloop.training.model import VLAPolicy

    _hopper_with_torchao(monkeypatch)
    p = precision.plan("fp8", "cuda", "torchao")
    assert p.name == "fp8"
    with torch.device("meta"):  # shapes only: no memory for base's weights
        small_model, base_model = VLAPolicy(small()), VLAPolicy(base())
    settled, names = precision.settle(p, small_model, precision.FP8_MIN_FEATURES, "preset small")
    assert (settled.name, names) == ("bf16", [])
    assert "no linear >= 1024 features in preset small" in settled.reason
    with pytest.raises(ValueError, match="precision=fp8: no linear in preset small reaches 1024 features"):
        precision.settle(p, small_model, precision.FP8_MIN_FEATURES, "preset small", explicit=True)  # asked for
    settled, names = precision.settle(p, base_model, precision.FP8_MIN_FEATURES, "preset base", explicit=True)
    assert settled.name == "fp8" and len(names) >= 32 and "blocks.0.mlp.fc1" in names
    rec = precision.run_record("fp8", settled, names, 1024, "default", torch.device("cpu"))
    assert rec["fp8_linears"] == len(names) and rec["fp8_backend"] == "torchao"
    assert "linears in FP8 (torchao)" in precision.record_line(rec)


def test_the_measured_threshold_is_used_for_its_gpu(monkeypatch, tmp_path):
    import json

    monkeypatch.setenv("ROBOLOOP_CACHE_DIR", str(tmp_path))
    assert precision.fp8_threshold(torch.device("cpu"))[0] == precision.FP8_MIN_FEATURES
    (tmp_path / precision.FP8_THRESHOLDS_FILE).write_text(json.dumps({"NVIDIA H100 80GB HBM3": 2048}))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _d=None: "NVIDIA H100 80GB HBM3")
    value, source = precision.fp8_threshold(torch.device("cuda"))
    assert value == 2048 and "measured eager on NVIDIA H100" in source
    (tmp_path / precision.FP8_THRESHOLDS_FILE).write_text(json.dumps({"NVIDIA H100 80GB HBM3": None}))
    assert precision.fp8_threshold(torch.device("cuda"))[0] == precision.FP8_MIN_FEATURES  # never faster: default


def test_torchao_conversion_runs_on_cpu_in_emulation():
    import torchao  # noqa: F401  (the gpu extra: installed everywhere, so this never skips)

    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 64))
    fp8 = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 64))
    fp8.load_state_dict(ref.state_dict())
    n = precision.apply_fp8(fp8, precision.PrecisionPlan("fp8", "test", "torchao"), 1024, emulate=True)
    assert n == 1 and type(fp8[0]).__name__ == "Float8Linear" and type(fp8[2]) is nn.Linear
    x = torch.randn(64, 1024)
    a, b = ref(x), fp8(x)
    b.sum().backward()
    assert ((a - b).norm() / a.norm()).item() < 0.1 and fp8[0].weight.grad is not None


def test_token_aligned_linears_see_multiples_of_16_and_return_exactly_the_unpadded_result():
    seen = []
    inner = nn.Linear(32, 8)
    inner.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    aligned = precision.TokenAligned(inner)
    for shape in [(37, 32), (3, 5, 32), (16, 32)]:
        x = torch.randn(*shape, requires_grad=True)
        y = aligned(x)
        assert y.shape == (*shape[:-1], 8) and torch.allclose(y, inner(x), atol=1e-6)
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape
    assert all(n % 16 == 0 for n in seen[::2])  # (every other call is the unwrapped reference)
    wrapped = nn.Sequential(precision.TokenAligned(nn.Linear(4, 4)))
    assert set(precision.plain_state_dict(wrapped.state_dict())) == set(nn.Sequential(nn.Linear(4, 4)).state_dict())


@pytest.mark.gpu
def test_torchao_fp8_linear_close_to_bf16():
    import torchao  # noqa: F401

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


def test_mfu_peaks_are_per_gpu_model_and_mode_and_fp32_is_not_tf32(monkeypatch):
    assert precision.peak("NVIDIA H100 80GB HBM3", "bf16") == (989.4, "H100 bf16 dense peak (NVIDIA datasheet)")
    assert precision.peak("NVIDIA H100 PCIe", "bf16")[0] == 756.5  # not the SXM part's
    assert precision.peak("NVIDIA H100 NVL", "fp8")[0] == 1670.5
    assert precision.peak("NVIDIA H200", "fp8")[0] == 1978.9
    assert precision.peak("NVIDIA A100-SXM4-80GB", "fp8") is None  # no FP8 tensor cores: no FP8 MFU
    assert precision.peak("NVIDIA L40S", "bf16")[0] == 362.1 and precision.peak("NVIDIA B200", "fp8")[0] == 4500.0
    assert precision.peak("NVIDIA H100 80GB HBM3", "fp32")[0] == 66.9  # roboloop never enables TF32
    assert not torch.backends.cuda.matmul.allow_tf32 and torch.get_float32_matmul_precision() == "highest"
    assert precision.peak_record(torch.device("cpu"), "fp32")["tflops"] is None
    monkeypatch.setenv("ROBOLOOP_PEAK_TFLOPS", "1.5")
    assert precision.peak_record(torch.device("cpu"), "fp32") == {"tflops": 1.5, "source": "ROBOLOOP_PEAK_TFLOPS"}
