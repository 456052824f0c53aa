"""The one place that probes optional heavy dependencies and hardware.

Everything optional (flash-attn, Transformer Engine, torchao, Isaac Lab, CUDA capability)
is checked here, and the errors say what to install or what hardware is missing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
from functools import cache

# the packages whose versions lineage and evaluation reports record
PACKAGES = ("roboloop", "torch", "lerobot", "isaaclab", "newton", "warp-lang", "gymnasium", "gym-pusht", "prefect",
            "dvc", "numpy")


def package_versions() -> dict[str, str]:
    """The installed versions of PACKAGES (and Python's): what a model's lineage and an evaluation report record."""
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


class MissingCapability(RuntimeError):
    """An explicitly requested feature cannot run here; the message says why and what to do."""


@cache
def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def flash_attn_available() -> bool:
    return has_module("flash_attn") and cuda_available()


def transformer_engine_available() -> bool:
    return has_module("transformer_engine") and cuda_available()


def torchao_available() -> bool:
    return has_module("torchao")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def cuda_capability() -> tuple[int, int] | None:
    import torch

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def cpu_bf16() -> str | None:
    """The instructions this CPU multiplies bf16 with natively (AMX or AVX512-BF16), or None. Without them
    oneDNN emulates bf16 with conversions, slower than fp32."""
    import torch

    probes = (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported"))
    for name, probe in probes:
        try:
            if getattr(torch.cpu, probe)():
                return name
        except (AttributeError, RuntimeError):
            continue
    return None


def torch_varlen_available() -> bool:
    """PyTorch's own varlen flash attention (torch >= 2.10, CUDA only)."""
    return has_module("torch.nn.attention.varlen") and cuda_available()


def fp8_hardware() -> bool:
    """FP8 tensor cores: compute capability >= 8.9 (Ada, Hopper, Blackwell)."""
    cap = cuda_capability()
    return cap is not None and cap >= (8, 9)


def require_fp8(backend: str) -> None:
    """Raise a MissingCapability naming exactly what is missing for explicit FP8."""
    problems = []
    if not cuda_available():
        problems.append("no CUDA GPU (FP8 needs compute capability >= 8.9: Ada, Hopper or Blackwell)")
    elif not fp8_hardware():
        cap = cuda_capability()
        problems.append(f"GPU compute capability {cap} < 8.9 (FP8 needs Ada, Hopper or Blackwell)")
    if backend == "te" and not has_module("transformer_engine"):
        problems.append("Transformer Engine is not installed (pip install --no-build-isolation "
                        "'transformer-engine[pytorch]==2.20.2' on a machine with CUDA headers, or use an NGC PyTorch "
                        "container; fp8_backend=torchao needs only `pip install 'roboloop[gpu]'`)")
    if backend == "torchao" and not has_module("torchao"):
        problems.append("torchao is not installed (pip install 'roboloop[gpu]')")
    if problems:
        raise MissingCapability("precision=fp8 cannot run here: " + "; ".join(problems))
