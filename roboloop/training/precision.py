"""Precision policy: `auto | fp8 | bf16 | fp32`.

FP8 only pays off on large GEMMs (torchao measures 0.80x at 1024x2048x1024 and 1.39x at
4096x8192x16384 on H100), so only linears whose in/out features both reach
`FP8_MIN_FEATURES` are converted; small ones stay bf16. FP8 runs through Transformer Engine
(`fp8_autocast`, DelayedScaling) or torchao's float8 training (tensorwise scaling). An
explicit `fp8` that cannot run fails with what is missing; `auto` falls back and says so.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from roboloop import availability

log = logging.getLogger(__name__)
FP8_MIN_FEATURES = 1024  # break-even on H100 is around 1-2k; below it FP8 casts cost more than they save


@dataclass
class PrecisionPlan:
    name: str  # fp8, bf16 or fp32
    reason: str
    fp8_backend: str | None = None

    def autocast(self, device_type: str) -> contextlib.AbstractContextManager:
        if self.name in ("bf16", "fp8") and device_type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()


def plan(requested: str, device_type: str, fp8_backend: str = "te") -> PrecisionPlan:
    if requested == "fp32":
        return PrecisionPlan("fp32", "requested")
    if requested == "bf16":
        if device_type != "cuda":
            raise availability.MissingCapability("precision=bf16 is for CUDA GPUs; use fp32 on CPU")
        return PrecisionPlan("bf16", "requested")
    if requested == "fp8":
        availability.require_fp8(fp8_backend)
        return PrecisionPlan("fp8", "requested", fp8_backend)
    # auto
    if device_type != "cuda":
        return PrecisionPlan("fp32", "auto: CPU -> fp32")
    for backend in (fp8_backend, "torchao" if fp8_backend == "te" else "te"):
        try:
            availability.require_fp8(backend)
            return PrecisionPlan("fp8", f"auto: FP8-capable GPU and {backend} installed", backend)
        except availability.MissingCapability as e:
            why = str(e)
    log.info("precision auto -> bf16 (%s)", why)
    return PrecisionPlan("bf16", f"auto: bf16 ({why})")


def fp8_filter(min_features: int = FP8_MIN_FEATURES) -> Callable[[nn.Module, str], bool]:
    def keep(module: nn.Module, _fqn: str) -> bool:
        return isinstance(module, nn.Linear) and module.in_features >= min_features \
            and module.out_features >= min_features and module.in_features % 16 == 0 \
            and module.out_features % 16 == 0
    return keep


def apply_fp8(model: nn.Module, p: PrecisionPlan, min_features: int = FP8_MIN_FEATURES) -> int:
    """Convert the large linears for FP8 training; returns how many were converted."""
    if p.name != "fp8":
        return 0
    keep = fp8_filter(min_features)
    names = [n for n, m in model.named_modules() if keep(m, n)]
    if p.fp8_backend == "torchao":
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=keep)
    else:
        import transformer_engine.pytorch as te

        for name in names:
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            old = model.get_submodule(name)
            new = te.Linear(old.in_features, old.out_features, bias=old.bias is not None)
            with torch.no_grad():
                new.weight.copy_(old.weight)
                if old.bias is not None:
                    new.bias.copy_(old.bias)
            setattr(parent, name.rsplit(".", 1)[-1], new)
    log.info("FP8 (%s) on %d linears >= %d features", p.fp8_backend, len(names), min_features)
    return len(names)


def fp8_context(p: PrecisionPlan) -> contextlib.AbstractContextManager:
    if p.name == "fp8" and p.fp8_backend == "te":
        import transformer_engine.pytorch as te
        from transformer_engine.common.recipe import DelayedScaling, Format

        return te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling(fp8_format=Format.HYBRID))
    return contextlib.nullcontext()


# Dense bf16 tensor-core peaks (TFLOP/s, SXM parts, no sparsity); FP8 doubles them on Hopper/Blackwell.
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "B200": 2250.0, "GB200": 2500.0,
                    "L40S": 362.0, "A100": 312.0, "A10G": 70.0, "L4": 121.0}


def peak_flops(device: torch.device, mode: str) -> float | None:
    """Peak FLOP/s of `device` for MFU, or None where unknown (CPU: set ROBOLOOP_PEAK_TFLOPS)."""

    from roboloop.settings import settings

    if settings().peak_tflops:
        return float(settings().peak_tflops) * 1e12  # type: ignore[arg-type]
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    tflops = next((v for k, v in sorted(PEAK_BF16_TFLOPS.items(), key=lambda kv: -len(kv[0])) if k in name), None)
    if tflops is None:
        return None
    if mode == "fp32":
        tflops /= 2  # TF32 tensor cores
    return tflops * 1e12
