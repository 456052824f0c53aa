"""Precision policy: `auto | fp8 | bf16 | fp32`.

FP8 only pays off on large GEMMs (torchao publishes 0.80x at 1024x2048x1024 and 1.39x at
4096x8192x16384 on H100, compiled), so only linears whose in/out features both reach a threshold are
converted; small ones stay bf16. The threshold is the break-even `bench/precision.py --grid`
measured on this GPU model when one is recorded (`FP8_THRESHOLDS_FILE`), else the documented
default `FP8_MIN_FEATURES`. `auto` picks FP8 only on a GPU model where that measurement found FP8
faster: on an H200, torchao's float8 in eager mode (how the trainer runs) measured 0.11-0.54x of bf16
per linear at 8192 tokens and 0.19x for a whole `base` step, so an unmeasured GPU trains in bf16 and
says why. An explicit `fp8` is honoured, or refused where it would convert no linear; a plan `auto` named
fp8 that would convert none is bf16, with that reason (`settle`). FP8 runs through Transformer Engine
(`fp8_autocast`, DelayedScaling) or torchao's float8 training (tensorwise scaling; `emulate` runs its
casts on CPU for tests). An explicit `fp8` that cannot run fails with what is missing; `auto` falls back and says so.
Every run records what actually ran (`run_record`): metrics.jsonl's first row, the model's
policy.json, the lineage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from roboloop import availability
from roboloop.training.runline import run_line

log = logging.getLogger(__name__)
FP8_MIN_FEATURES = 1024  # break-even on H100 is around 1-2k; below it FP8 casts cost more than they save
FP8_THRESHOLDS_FILE = "fp8_thresholds.json"  # under the cache dir: {GPU name: measured break-even features}


@dataclass
class PrecisionPlan:
    name: str  # fp8, bf16 or fp32
    reason: str
    fp8_backend: str | None = None
    fp8_recipe: str = "tensorwise"  # torchao's scaling (TrainRecipe.fp8_recipe)

    def autocast(self, device_type: str) -> contextlib.AbstractContextManager:
        if self.name in ("bf16", "fp8") and device_type in ("cuda", "cpu"):  # fp8 plans are CUDA-only
            return torch.autocast(device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


def plan(requested: str, device_type: str, fp8_backend: str = "torchao", gpu_name: str | None = None,
         compiled: bool = False) -> PrecisionPlan:
    """`gpu_name`: the CUDA device's name (asked of torch when not given), for `auto`'s measured break-even;
    `compiled`: whether the run compiles its blocks (the break-even measured compiled then speaks for it)."""
    if requested == "fp32":
        return PrecisionPlan("fp32", "requested")
    if requested == "bf16":
        if device_type == "cpu":
            native = availability.cpu_bf16()
            if native is None:
                raise availability.MissingCapability(
                    "precision=bf16 on this CPU would be emulated (it has neither AMX nor AVX512-BF16) and slower "
                    "than fp32: use fp32 here")
            return PrecisionPlan("bf16", f"requested (CPU autocast; this CPU multiplies bf16 with {native})")
        return PrecisionPlan("bf16", "requested")
    if requested == "fp8":
        availability.require_fp8(fp8_backend)
        return PrecisionPlan("fp8", "requested", fp8_backend)
    # auto
    if device_type != "cuda":  # bf16 on a CPU that multiplies it natively is asked for, never assumed: it would
        return PrecisionPlan("fp32", "auto: CPU -> fp32")  # change runs reproduced in fp32 (the demo's weights)
    for backend in (fp8_backend, "torchao" if fp8_backend == "te" else "te"):
        try:
            availability.require_fp8(backend)
        except availability.MissingCapability as e:
            why = str(e)
            continue
        name = gpu_name or torch.cuda.get_device_name()
        found, break_even, where = recorded_break_even(name, compiled)
        how = "compiled" if compiled else "eager"
        if found and break_even is not None:
            return PrecisionPlan("fp8", f"auto: {backend} installed and FP8 measured faster {how} on {name} from "
                                 f"{break_even} features ({where})", backend)
        why = (f"FP8 measured slower than bf16 {how} at every width on {name} ({where})" if found else
               f"FP8 not measured faster {how} on {name}: `python bench/precision.py --grid"
               f"{' --compile' if compiled else ''}` measures it and records the break-even (torchao's eager float8 "
               "ran 0.11-0.54x of bf16 per linear on an H200)")
        break
    log.info("precision auto -> bf16 (%s)", why)
    return PrecisionPlan("bf16", f"auto: bf16 ({why})")


def fit(p: PrecisionPlan, requested: str, fp32_only: str | None) -> PrecisionPlan:
    """The plan for a model that trains only in fp32 (`fp32_only` says why): `auto` becomes fp32 with that reason,
    an explicit bf16 or fp8 is refused with it."""
    if fp32_only is None or p.name == "fp32":
        return p
    if requested != "auto":
        raise availability.MissingCapability(f"precision={requested}: {fp32_only}")
    return PrecisionPlan("fp32", f"auto: fp32 ({fp32_only})")


def fp8_filter(min_features: int = FP8_MIN_FEATURES) -> Callable[[nn.Module, str], bool]:
    def keep(module: nn.Module, _fqn: str) -> bool:
        return isinstance(module, nn.Linear) and module.in_features >= min_features \
            and module.out_features >= min_features and module.in_features % 16 == 0 \
            and module.out_features % 16 == 0
    return keep


def convertible(model: nn.Module, min_features: int = FP8_MIN_FEATURES) -> list[str]:
    """Names of the linears FP8 would convert (both features >= `min_features`, multiples of 16)."""
    keep = fp8_filter(min_features)
    return [n for n, m in model.named_modules() if keep(m, n)]


def settle(p: PrecisionPlan, model: nn.Module, min_features: int, what: str,
           explicit: bool = False) -> tuple[PrecisionPlan, list[str]]:
    """The plan that will really run on `model`, and the linears FP8 converts. An fp8 plan that `auto` chose and
    that converts no linear is bf16 (a plan that does nothing is not reported as done); an explicit `fp8` that
    would convert none is refused with the reason (it was silently bf16)."""
    if p.name != "fp8":
        return p, []
    names = convertible(model, min_features)
    if not names and explicit:
        raise ValueError(f"precision=fp8: no linear in {what} reaches {min_features} features, the break-even below "
                         "which FP8's casts cost more than they save, so FP8 would convert none: train with "
                         "precision bf16 (or auto), or a larger preset (base, n15)")
    if not names:
        return PrecisionPlan("bf16", f"bf16: no linear >= {min_features} features in {what} (FP8 would convert "
                             f"none; {p.reason})"), []
    return p, names


def grid_key(gpu_name: str, compiled: bool) -> str:
    """The key of a GPU model's break-even in FP8_THRESHOLDS_FILE: measured eager, or compiled (`|compiled`)."""
    return f"{gpu_name}|compiled" if compiled else gpu_name


def recorded_break_even(gpu_name: str, compiled: bool = False) -> tuple[bool, int | None, str]:
    """(measured on this GPU model, eager or compiled as the run trains?, the width from which FP8 was faster or
    None where it never was, the file) as `bench/precision.py --grid [--compile]` recorded it."""
    import json
    from pathlib import Path

    from roboloop.settings import settings

    f = Path(settings().cache_dir) / FP8_THRESHOLDS_FILE
    try:
        known = json.loads(f.read_text()) if f.is_file() else {}
    except ValueError:
        known = {}
    key = grid_key(gpu_name, compiled)
    if not isinstance(known, dict) or key not in known:
        return False, None, str(f)
    value = known[key]
    return True, int(value) if value else None, str(f)


def fp8_threshold(device: torch.device, compiled: bool = False) -> tuple[int, str]:
    """(min features, where it came from): the break-even measured on this GPU model (eager or compiled, as the run
    trains), else the default."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        found, measured, where = recorded_break_even(name, compiled)
        if found and measured:
            return measured, f"measured {'compiled' if compiled else 'eager'} on {name} ({where})"
    return FP8_MIN_FEATURES, "documented default (bench/precision.py --grid measures this GPU's)"


def run_record(requested: str, p: PrecisionPlan, fp8_names: list[str], threshold: int, threshold_source: str,
               device: torch.device, kernels: dict | None = None) -> dict:
    """What ran: precision requested and used (and why), FP8 backend and converted linears, the attention kernel
    and why, device, capability, torch/CUDA versions."""
    cuda = device.type == "cuda"
    cap = torch.cuda.get_device_capability(device) if cuda else None
    fp8 = p.name == "fp8"
    return {"precision_requested": requested, "precision": p.name, "precision_reason": p.reason,
            "fp8_backend": p.fp8_backend if fp8 else None,
            "fp8_recipe": (p.fp8_recipe if p.fp8_backend == "torchao" else "DelayedScaling") if fp8 else None,
            "fp8_linears": len(fp8_names),
            "fp8_linear_names": fp8_names, "fp8_min_features": threshold, "fp8_threshold_source": threshold_source,
            **(kernels or {}), "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "capability": f"{cap[0]}.{cap[1]}" if cap else None, "torch": torch.__version__,
            "cuda": torch.version.cuda}


def record_line(rec: dict) -> str:
    return run_line(rec)


def fp8_all_gather(p: PrecisionPlan, sharded: bool, recipe: str) -> tuple[bool, str]:
    """Whether FSDP2 gathers the FP8 linears' weights in FP8 (half the bytes of bf16, a quarter of fp32), and why:
    torchao does it for tensorwise scaling under FSDP2 (`enable_fsdp_float8_all_gather`)."""
    if p.name != "fp8":
        return False, "off: not an FP8 run"
    if not sharded:
        return False, "off: no FSDP2 (the weights are not gathered)"
    if p.fp8_backend != "torchao":
        return False, f"off: {p.fp8_backend} has no FP8 all-gather under FSDP2 (torchao does)"
    if recipe != "tensorwise":
        return False, f"off: torchao gathers in FP8 with tensorwise scaling only, not fp8_recipe={recipe}"
    return True, "on: torchao's enable_fsdp_float8_all_gather, the scales precomputed after each optimizer step"


def after_optimizer_step(model: nn.Module) -> None:
    """With FP8 all-gather: every FP8 weight's scale in one all-reduce for the next step's gathers (torchao's
    `precompute_float8_dynamic_scale_for_fsdp`, instead of one small all-reduce per weight)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def apply_fp8(model: nn.Module, p: PrecisionPlan, min_features: int = FP8_MIN_FEATURES,
              emulate: bool = False, recipe: str = "tensorwise", all_gather: bool = False) -> int:
    """Convert the large linears for FP8 training; returns how many were converted. `recipe`: torchao's scaling
    (tensorwise, rowwise, rowwise_with_gw_hp); `all_gather` (see `fp8_all_gather`): their weights gathered in FP8 by
    FSDP2, which then wraps the converted model."""
    if p.name != "fp8":
        return 0
    keep = fp8_filter(min_features)
    names = [n for n, m in model.named_modules() if keep(m, n)]
    if p.fp8_backend == "torchao":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        device = next(model.parameters()).device
        if recipe != "tensorwise" and not emulate and device.type == "cuda" \
                and torch.cuda.get_device_capability(device) < (9, 0):
            raise availability.MissingCapability(
                f"fp8_recipe={recipe}: rowwise-scaled FP8 GEMMs need compute capability 9.0 (H100) or newer; "
                f"{torch.cuda.get_device_name(device)} has {torch.cuda.get_device_capability(device)}: use tensorwise")

        # pad_inner_dim: the weight-gradient GEMM's inner dimension is the packed token count, which is not
        # a multiple of 16 in general
        config = Float8LinearConfig.from_recipe_name(recipe)
        config = dataclasses.replace(config, emulate=emulate, pad_inner_dim=True,
                                     enable_fsdp_float8_all_gather=all_gather)
        convert_to_float8_training(model, module_filter_fn=keep, config=config)
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
            setattr(parent, name.rsplit(".", 1)[-1], TokenAligned(new))
    log.info("FP8 (%s) on %d linears >= %d features", p.fp8_backend, len(names), min_features)
    return len(names)


class TokenAligned(nn.Module):
    """A linear whose token count (all leading dimensions) is padded to a multiple of 16 and cut back after:
    FP8 GEMMs need aligned shapes, and a packed batch's token count is whatever its samples add up to."""

    ALIGN = 16

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.fp8_linear = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, n = x.shape[:-1], x.shape[:-1].numel()
        flat = x.reshape(n, x.shape[-1])
        pad = (-n) % self.ALIGN
        if pad:
            flat = torch.nn.functional.pad(flat, (0, 0, 0, pad))
        y = self.fp8_linear(flat)
        return y[:n].reshape(*lead, y.shape[-1])


def plain_state_dict(sd: dict) -> dict:
    """The weights as the unconverted model names them (what a model folder stores and every loader reads):
    Transformer Engine's wrapped linears back to `name.weight`, its FP8 scaling state dropped."""
    return {k.replace(".fp8_linear.", "."): v for k, v in sd.items() if not k.endswith("_extra_state")}


def fp8_context(p: PrecisionPlan) -> contextlib.AbstractContextManager:
    if p.name == "fp8" and p.fp8_backend == "te":
        import transformer_engine.pytorch as te
        from transformer_engine.common.recipe import DelayedScaling, Format

        return te.fp8_autocast(enabled=True, fp8_recipe=DelayedScaling(fp8_format=Format.HYBRID))
    return contextlib.nullcontext()


# Dense peaks (TFLOP/s, no sparsity) from NVIDIA's datasheets, per GPU model and the mode a step runs in. fp32 is
# IEEE fp32 on the CUDA cores: roboloop never enables TF32 (torch's default, "highest" matmul precision), so an fp32
# run is the same arithmetic as on a CPU and its MFU is against the fp32 peak, not TF32's 8x larger one. Names are
# matched longest first, so "H100 PCIe" and "H100 NVL" are not taken for the SXM part (torch names it "H100 80GB HBM3").
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100": {"bf16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},  # SXM5
    "H100 PCIe": {"bf16": 756.5, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.5, "fp8": 1670.5, "tf32": 417.5, "fp32": 60.0},
    "H200": {"bf16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},  # SXM
    "H800": {"bf16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    "B200": {"bf16": 2250.0, "fp8": 4500.0, "tf32": 1125.0, "fp32": 75.0},  # HGX B200, per GPU
    "A100": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},  # no FP8 tensor cores
    "L40S": {"bf16": 362.1, "fp8": 733.0, "tf32": 183.0, "fp32": 91.6},
    "L4": {"bf16": 121.0, "fp8": 242.5, "tf32": 60.0, "fp32": 30.3},
    "A10G": {"bf16": 70.0, "tf32": 35.0, "fp32": 31.2},
}


def peak(name: str, mode: str) -> tuple[float, str] | None:
    """(TFLOP/s, which entry) of a CUDA device named `name` in `mode` (bf16, fp8, fp32), or None where unknown."""
    key = next((k for k in sorted(PEAK_TFLOPS, key=len, reverse=True) if k in name), None)
    if key is None or mode not in PEAK_TFLOPS[key]:
        return None
    return PEAK_TFLOPS[key][mode], f"{key} {mode} dense peak (NVIDIA datasheet)"


def peak_flops(device: torch.device, mode: str) -> float | None:
    """Peak FLOP/s of `device` in `mode` for MFU, or None where unknown (CPU: set ROBOLOOP_PEAK_TFLOPS)."""

    from roboloop.settings import settings

    if settings().peak_tflops:
        return float(settings().peak_tflops) * 1e12  # type: ignore[arg-type]
    if device.type != "cuda":
        return None
    found = peak(torch.cuda.get_device_name(device), mode)
    return found[0] * 1e12 if found else None


def peak_record(device: torch.device, mode: str) -> dict:
    """What a run's MFU is relative to: the peak and where it comes from (the run record's `mfu_peak`)."""
    from roboloop.settings import settings

    if settings().peak_tflops:
        return {"tflops": float(settings().peak_tflops), "source": "ROBOLOOP_PEAK_TFLOPS"}  # type: ignore[arg-type]
    if device.type != "cuda":
        return {"tflops": None, "source": "no peak known for a CPU: set ROBOLOOP_PEAK_TFLOPS for an MFU"}
    name = torch.cuda.get_device_name(device)
    found = peak(name, mode)
    return {"tflops": found[0], "source": found[1]} if found else \
        {"tflops": None, "source": f"{name} in {mode} is not in roboloop's peak table (set ROBOLOOP_PEAK_TFLOPS)"}
