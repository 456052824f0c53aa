"""LeRobot's foundation policies built as LeRobot builds them, on the meta device (no weights, no memory, no GPU),
for sizing a fine-tune before it runs (`roboloop plan`, roboloop/training/plan.py).

π0.5 (`pi05`) and π0 (`pi0`) are built from their own code: PaliGemma (SigLIP so400m and Gemma 2B) with a Gemma
300M action expert, the sizes their configs name. A LeRobot policy folder (`--pretrained DIR`, its `config.json`)
gives the variants, cameras, state and action sizes it was saved with; nothing is downloaded. GR00T and X-VLA are
refused by name: their code cannot build them from a configuration alone (see REFUSED).

What a fine-tuning mode trains (`finetune`), as roboloop's engine trains it (roboloop/training/finetune.py):
`full`, everything; `frozen_backbone`, everything but the vision-language backbone (LeRobot's
`train_expert_only`: the action expert and the projections); `lora`, adapters of rank r on the layers LeRobot
names for `lerobot-train --peft` (`_get_default_peft_targets`: the expert's attention q/v and the action
projections) or on `lora_targets`, everything else frozen."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

FAMILIES = ("pi05", "pi0")
REFUSED = {
    "groot": "GR00T N1.7 (LeRobot 0.6.1) builds its Qwen3-VL backbone by loading the base model's weights "
             "(transformers from_pretrained of nvidia/GR00T-N1.7-3B), so it cannot be sized without them",
    "xvla": "X-VLA's forward counts its images with a data-dependent .item() (Florence-2 encoder), which the meta "
            "device cannot run",
}
BACKBONE = "model.paligemma_with_expert.paligemma"  # both families: frozen_backbone freezes it
FETCH = ("a LeRobot policy folder (config.json, model.safetensors), e.g. `huggingface-cli download lerobot/{name} "
         "--local-dir DIR` on a machine with the Hub, copied here")


@dataclass
class Built:
    """A family's policy on the meta device and how to run a training loss of `b` samples through it."""

    family: str
    policy: nn.Module
    config: object
    loss: Callable[[int], torch.Tensor]
    tokens_per_sample: int  # what one sample's sequence holds: image patches, instruction tokens, action chunk
    backbone: str = BACKBONE


def _config_class(family: str):
    if family == "pi05":
        from lerobot.policies.pi05.configuration_pi05 import PI05Config
        return PI05Config
    from lerobot.policies.pi0.configuration_pi0 import PI0Config
    return PI0Config


def _check(family: str, pretrained: Path | None) -> None:
    if family in REFUSED:
        raise ValueError(f"policy type {family!r} cannot be planned here: {REFUSED[family]}")
    if family not in FAMILIES:
        raise ValueError(f"policy type {family!r}: plan knows {', '.join(FAMILIES)}")
    if pretrained is None:
        return
    name = {"pi05": "pi05_base", "pi0": "pi0_base"}[family]
    if not (pretrained / "config.json").is_file():
        raise FileNotFoundError(f"--pretrained {pretrained}: no config.json there; fetch {FETCH.format(name=name)}")
    kind = json.loads((pretrained / "config.json").read_text()).get("type")
    if kind != family:
        raise ValueError(f"--pretrained {pretrained}: its config.json is a {kind!r} policy, not {family!r}")


def lerobot_config(family: str, pretrained: Path | None = None, cameras: int = 2, state_dim: int = 6,
                   action_dim: int = 6, precision: str = "bf16"):
    """The family's LeRobot config: the folder's own (read as LeRobot reads it, from this folder only) or the
    defaults with `cameras` images at the family's resolution and the given state and action sizes."""
    from lerobot.configs.types import FeatureType, PolicyFeature

    _check(family, pretrained)
    cls = _config_class(family)
    if pretrained is not None:
        cfg = cls.from_pretrained(str(pretrained), local_files_only=True)
    else:
        cfg = cls(device="cpu")
        h, w = cfg.image_resolution
        cfg.input_features = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(state_dim,)),
                              **{f"observation.images.cam{i}": PolicyFeature(type=FeatureType.VISUAL,
                                                                             shape=(3, h, w))
                                 for i in range(cameras)}}
        cfg.output_features = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))}
    if cfg.paligemma_variant != "gemma_2b":
        raise ValueError(f"paligemma_variant={cfg.paligemma_variant!r}: LeRobot's {family} projects the image "
                         "tokens 2048 wide whatever the backbone (PaliGemmaWithExpertModel sets projection_dim=2048), "
                         "so only a gemma_2b backbone runs; its config accepts gemma_300m, its forward does not")
    cfg.dtype = "float32" if precision == "fp32" else "bfloat16"
    cfg.device = "meta"  # after validation: LeRobot's own check knows cuda, mps, xpu and cpu
    return cfg


def build(family: str, pretrained: Path | None = None, cameras: int = 2, state_dim: int = 6, action_dim: int = 6,
          precision: str = "bf16", activation_checkpointing: bool = False) -> Built:
    """The policy as LeRobot's class builds it, on the meta device, with a training loss for `b` samples."""
    cfg = lerobot_config(family, pretrained, cameras, state_dim, action_dim, precision)
    if family == "pi05":
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy as Policy
    else:
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy as Policy
    with torch.device("meta"):
        policy = Policy(cfg)
    policy.train()
    if activation_checkpointing:
        policy.model.gradient_checkpointing_enable()
    images = sum(1 for f in cfg.input_features.values() if f.type.name == "VISUAL") + cfg.empty_cameras
    vision = policy.model.paligemma_with_expert.paligemma.config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    tokens = images * patches + cfg.tokenizer_max_length + cfg.chunk_size + (family == "pi0")
    return Built(family, policy, cfg, _loss(family, policy, cfg, images), tokens)


def _loss(family: str, policy: nn.Module, cfg, images: int) -> Callable[[int], torch.Tensor]:
    """The training forward of `b` samples, on meta tensors of the shapes LeRobot's preprocessing gives the model
    (images at the family's resolution, the instruction padded to tokenizer_max_length, the padded action chunk;
    π0 also takes the padded state), with noise and flow time passed in."""

    def run(b: int) -> torch.Tensor:
        meta = {"device": "meta"}
        h, w = cfg.image_resolution
        imgs = [torch.zeros(b, 3, h, w, **meta) for _ in range(images)]
        masks = [torch.ones(b, dtype=torch.bool, **meta) for _ in range(images)]
        tok = torch.zeros(b, cfg.tokenizer_max_length, dtype=torch.long, **meta)
        tmask = torch.ones(b, cfg.tokenizer_max_length, dtype=torch.bool, **meta)
        act = torch.zeros(b, cfg.chunk_size, cfg.max_action_dim, **meta)
        t = torch.zeros(b, **meta)
        if family == "pi0":
            state = torch.zeros(b, cfg.max_state_dim, **meta)
            return policy.model.forward(imgs, masks, tok, tmask, state, act, torch.zeros_like(act), t)
        return policy.model.forward(imgs, masks, tok, tmask, act, torch.zeros_like(act), t)

    return run


def lora_modules(policy: nn.Module, targets: str | None = None) -> list[tuple[str, nn.Linear]]:
    """The linear layers LoRA adapts: those whose whole name `targets` matches (default: the policy's own)."""
    from roboloop.training.finetune import linear_layers

    return linear_layers(policy, targets or policy._get_default_peft_targets()["target_modules"])


def freeze(built: Built, finetune: str, rank: int = 16, targets: str | None = None) -> dict:
    """Set requires_grad as the fine-tuning mode trains, and count: parameters, trainable parameters (LoRA's
    adapters counted from the adapted layers' own shapes: rank x (in + out) each), frozen ones."""
    policy = built.policy
    params = sum(p.numel() for p in policy.parameters())
    adapters = 0
    if finetune == "full":
        for p in policy.parameters():
            p.requires_grad_(True)
    elif finetune == "frozen_backbone":
        for n, p in policy.named_parameters():
            p.requires_grad_(not n.startswith(built.backbone + "."))
    elif finetune == "lora":
        layers = lora_modules(policy, targets)
        if not layers:
            raise ValueError(f"finetune lora: lora targets {targets!r} match no linear layer of {built.family}")
        for p in policy.parameters():
            p.requires_grad_(False)
        for _, m in layers:  # the adapted layers' weights stand in for their adapters in what the meta device
            m.weight.requires_grad_(True)  # measures: the backward pass reaches them and keeps their inputs
        adapters = sum(rank * (m.in_features + m.out_features) for _, m in layers)
    else:
        raise ValueError(f"finetune {finetune!r}: one of full, frozen_backbone, lora")
    whole = 0 if finetune == "lora" else sum(p.numel() for p in policy.parameters() if p.requires_grad)
    return {"params": params + adapters, "trainable": whole + adapters, "adapters": adapters,
            "frozen": params - whole}
