"""What a fine-tune trains (`train.finetune`): `full`, every parameter the policy's own configuration trains;
`frozen_backbone`, all but the family's backbone (SmolVLA: its VLM; ACT: its ResNet); `lora`, low-rank adapters of
rank `lora_rank` (scale `lora_alpha / lora_rank`) on the layers `lora_targets` names (default: the family's own,
as LeRobot's `_get_default_peft_targets` gives them to `lerobot-train --peft`), everything else frozen.

Adapters come from PEFT (`inject_adapter_in_model`: each adapted `nn.Linear` becomes PEFT's LoRA layer around it,
with A initialised at random and B at zero, so training starts from the model as it was). Checkpoints hold the
adapters, so a run resumes exactly; the saved model is merged and plain (`merged`: W + scale x B A, the adapters'
keys gone), so LeRobot's `from_pretrained`, the registry and `roboloop serve` read it without PEFT.

A family says what it can fine-tune through its trainable's `finetune_spec()`: the module to adapt, the name
prefix of its backbone and its default LoRA targets (a regex PEFT matches against whole module names). A family
without one refuses every mode but `full`, saying why."""

from __future__ import annotations

import re

import torch
from torch import nn

LORA_KEY = re.compile(r"\.lora_[AB]\.default\.weight$")


def apply(trainable, cfg) -> dict:
    """Set what trains for `cfg.finetune` (after any init_from weights are in, before the optimizer is built);
    returns the run record's `finetune`."""
    mode = cfg.finetune
    if mode == "full":
        return {"mode": "full"}
    spec = getattr(trainable, "finetune_spec", None)
    if spec is None:
        raise ValueError(f"finetune {mode}: family {cfg.family} names no backbone or LoRA targets (it trains from "
                         "scratch here); use finetune full")
    module, backbone, targets = spec()
    if mode == "frozen_backbone":
        if backbone is None:
            raise ValueError("finetune frozen_backbone: this policy names no backbone (use lora or full)")
        frozen = [p.requires_grad_(False) for n, p in module.named_parameters() if n.startswith(backbone + ".")]
        if not frozen:
            raise ValueError(f"finetune frozen_backbone: no parameter of this model is under {backbone!r}")
        return {"mode": mode, "backbone": backbone}
    return _lora(module, cfg.lora_targets or targets, cfg.lora_rank, _alpha(cfg))


def _alpha(cfg) -> int:
    return int(cfg.lora_alpha if cfg.lora_alpha is not None else cfg.lora_rank)


def _lora(module: nn.Module, targets: str | None, rank: int, alpha: int) -> dict:
    from peft import LoraConfig, inject_adapter_in_model

    if not targets:
        raise ValueError("finetune lora: this policy has no default LoRA targets; set lora_targets (a regex of "
                         "whole module names, e.g. '.*\\.(q|v)_proj')")
    names = [n for n, _ in linear_layers(module, targets)]
    if not names:
        raise ValueError(f"finetune lora: lora_targets {targets!r} matches no linear layer of this model")
    for p in module.parameters():
        p.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=names, lora_dropout=0.0,
                                       bias="none"), module)
    for n, p in module.named_parameters():
        p.requires_grad_(".lora_A." in n or ".lora_B." in n)
    return {"mode": "lora", "rank": rank, "alpha": alpha, "targets": targets, "layers": len(names)}


def linear_layers(module: nn.Module, targets: str) -> list[tuple[str, nn.Linear]]:
    """The linear layers whose whole module name `targets` (a regex) matches: what LoRA adapts."""
    return [(n, m) for n, m in module.named_modules() if isinstance(m, nn.Linear) and re.fullmatch(targets, n)]


def merged(state: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """The weights as the plain model names them: each adapted layer's W + (alpha / rank) x B A, its bias as it
    was, the adapters' own keys gone. A state without adapters is returned as it is."""
    if cfg.finetune != "lora":
        return state
    scale = _alpha(cfg) / cfg.lora_rank
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if LORA_KEY.search(key):
            continue
        if ".base_layer." not in key:
            out[key] = value
            continue
        layer, _, leaf = key.rpartition(".base_layer.")
        if leaf == "weight":
            a, b = state[f"{layer}.lora_A.default.weight"], state[f"{layer}.lora_B.default.weight"]
            value = (value.float() + scale * (b.float() @ a.float())).to(value.dtype)
        out[f"{layer}.{leaf}"] = value
    return out
