"""The optimiser: AdamW, run by PyTorch's fused kernel wherever it has one for every parameter.

`torch.optim.AdamW` with its defaults updates a CPU model one parameter at a time, about ten small ops each (its
`foreach` default applies only when every parameter is on CUDA). The fused kernel does the whole update in one
pass per parameter with the same formula (decoupled weight decay, bias-corrected moments), on CPU and CUDA.
Measured by `bench/optim.py` on a 2-core AVX-512 EPYC: LeRobot's default ACT (153 parameters, 51.6 M values)
97 -> 25 ms per step (3.9x), roboloop's tiny VLA 3.0 -> 0.6 ms (4.8x), its small one 36 -> 16 ms. The update is
the same up to float rounding: a run stays reproducible on its machine, and its optimizer state loads in either
implementation (resume across the change). A parameter the kernel does not take (a device without it, a
non-float parameter, a tensor subclass other than FSDP2's DTensor) keeps PyTorch's default, and the run record
says which ran.
"""

from __future__ import annotations

import torch
from torch import nn


def _fusable(p: torch.Tensor) -> bool:
    local = p
    if type(p) not in (torch.Tensor, nn.Parameter):
        from torch.distributed.tensor import DTensor

        if not isinstance(p, DTensor):
            return False
        local = p.to_local()
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return local.is_floating_point() and local.device.type in _get_fused_kernels_supported_devices()


def adamw(params, lr: float, weight_decay: float) -> tuple[torch.optim.AdamW, str]:
    """AdamW over `params`, fused where every parameter allows it; also what ran, for the run record."""
    params = list(params)
    fused = bool(params) and all(_fusable(p) for p in params)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True if fused else None)
    return opt, ("AdamW, fused kernel" if fused else
                 "AdamW, PyTorch's default loop (a parameter the fused kernel does not take)")


def counts(model: nn.Module) -> dict:
    """The run record's `parameters`: how many the model has and how many train (requires_grad), each counted
    whole (a sharded parameter's global size)."""
    params = list(model.parameters())
    return {"total": sum(p.numel() for p in params), "trainable": sum(p.numel() for p in params if p.requires_grad)}


def trained(rec: dict) -> str:
    """The run header's words for the record's `parameters`."""
    tuned = rec.get("finetune", {})
    how = {"lora": f"LoRA rank {tuned.get('rank')} on {tuned.get('layers')} layers",
           "frozen_backbone": f"{tuned.get('backbone')} frozen"}.get(tuned.get("mode"), "full fine-tune")
    return f"{rec['trainable']:,} of {rec['total']:,} parameters trained ({how})"
