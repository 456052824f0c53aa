"""Convolutional backbones trained faster, with the same arithmetic: frozen norms folded into their convs, the
stem's ReLU moved after its max pool, and channels-last activations.

LeRobot's ACT builds its ResNet with torchvision's `FrozenBatchNorm2d` (`norm_layer=FrozenBatchNorm2d`): a
per-channel affine map `y = x * s + b` with `s = weight / sqrt(running_var + eps)` and `b = bias - running_mean *
s`, all buffers, never trained. In eager mode every one of them is two more passes over the conv's output (and
two more in the backward pass), at 480x640 the largest tensors of the step. Since `conv(x, W) * s + b ==
conv(x, W * s) + b`, the conv can run on `W * s` (recomputed at every forward from the trained `W`, so the
gradient reaching `W` is the same) and the norm becomes the identity. Nothing is renamed or re-registered: the
two modules keep their parameters, buffers and state-dict keys (LeRobot's `from_pretrained` reads the weights
as before); only their classes change, to the subclasses below.

Channels-last (NHWC) is the layout oneDNN's and cuDNN's fastest convolution kernels use; with the weights in it,
PyTorch runs every conv and its backward in it and keeps the activations there. The values are the same up to
the order of floating-point sums.

Measured on a 2-core AVX-512 EPYC (`bench/lerobot_train.py`, ACT with one 480x640 camera): folding and NHWC
together take a training step from about 2.0 to 1.65 s in fp32, and with bf16 autocast (which that CPU runs
natively) to about 0.95 s. On small images (64x64) they neither help nor hurt. Channels-last alone did not help
Diffusion's GroupNorm ResNet (0.95x at 96x96, where its 1D U-Net dominates), so it is applied where norms fold.

A ResNet's stem runs ReLU then a 3x3 max pool (stride 2) on the largest map of the step (at 480x640 and batch 4,
4x64x240x320). `max(relu(x)) == relu(max(x))`, so the pool can run first and the ReLU on a quarter of the values;
its backward pass (a read of the map and its gradient, a write of the gradient) shrinks by as much. The values and
gradients are bit for bit the same (tests/unit/training/test_convs.py); ACT's step at 480x640 measured about 2%
shorter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d


class FoldedConv2d(nn.Conv2d):
    """A bias-free Conv2d whose following frozen norm is folded into its weights at each forward."""

    _folded_norm: tuple[nn.Module, ...]  # (the norm,): a tuple, so it is not registered as a child module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = self._folded_norm[0]
        scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
        weight = self.weight * scale.reshape(-1, 1, 1, 1)
        shift = norm.bias - norm.running_mean * scale
        return F.conv2d(x, weight, shift, self.stride, self.padding, self.dilation, self.groups)


class FoldedFrozenNorm(FrozenBatchNorm2d):
    """A FrozenBatchNorm2d whose map its conv applies: the identity here, its buffers kept (and saved, and loaded
    as FrozenBatchNorm2d loads them)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _foldable(conv: nn.Module, norm: nn.Module) -> bool:
    return (type(conv) is nn.Conv2d and conv.bias is None and conv.padding_mode == "zeros"
            and type(norm) is FrozenBatchNorm2d and norm.weight.shape[0] == conv.out_channels)


def _pairs(parent: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    """(conv, norm) pairs whose data flows conv -> norm with nothing between: in an nn.Sequential, neighbours;
    in torchvision's ResNet and its blocks (and LeRobot's IntermediateLayerGetter over a ResNet), `convK` ->
    `bnK`, as their forward methods are written."""
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

    children = dict(parent.named_children())
    if type(parent) is nn.Sequential:
        mods = list(children.values())
        return list(zip(mods, mods[1:], strict=False))
    if isinstance(parent, BasicBlock | Bottleneck | ResNet | IntermediateLayerGetter):
        return [(children[f"conv{k}"], children[f"bn{k}"]) for k in (1, 2, 3)
                if f"conv{k}" in children and f"bn{k}" in children]
    return []


def fold_frozen_norms(model: nn.Module) -> int:
    """Fold every frozen norm that directly follows a bias-free conv into it; returns how many were folded."""
    folded = 0
    for parent in list(model.modules()):
        for conv, norm in _pairs(parent):
            if _foldable(conv, norm):
                conv.__class__ = FoldedConv2d
                conv._folded_norm = (norm,)
                norm.__class__ = FoldedFrozenNorm
                folded += 1
    return folded


@torch.no_grad()
def fold_for_inference(model: nn.Module) -> int:
    """`fold_frozen_norms` once and for all, for a model that only acts: the norm's scale is multiplied into the
    conv's weights and its shift becomes the conv's bias (no per-forward work; `fold_frozen_norms` recomputes
    `W * scale` at every forward, a pass over every conv weight that small images cannot hide). The state dict
    is then no longer LeRobot's (each folded conv has a bias and the scaled weights): never save it."""
    folded = 0
    for parent in list(model.modules()):
        for conv, norm in _pairs(parent):
            if _foldable(conv, norm):
                scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
                conv.weight.mul_(scale.reshape(-1, 1, 1, 1))
                conv.bias = nn.Parameter(norm.bias - norm.running_mean * scale, requires_grad=False)
                norm.__class__ = FoldedFrozenNorm
                folded += 1
    return folded


class IdentityReLU(nn.ReLU):
    """A ReLU whose work the max pool after it does (`PoolThenReLU`): the identity here."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class PoolThenReLU(nn.MaxPool2d):
    """A max pool that applies the ReLU before it on its (4x smaller) output: max and ReLU commute, and the
    gradient reaches the same inputs (a window whose maximum is not positive passes none either way)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu_(super().forward(x))


def _relu_pool_pairs(parent: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    """(ReLU, MaxPool2d) pairs whose data flows ReLU -> pool with nothing between: neighbours in an nn.Sequential
    or an IntermediateLayerGetter (which run their children in order), and the stem of torchvision's ResNet."""
    from torchvision.models._utils import IntermediateLayerGetter
    from torchvision.models.resnet import ResNet

    children = dict(parent.named_children())
    if type(parent) is nn.Sequential or type(parent) is IntermediateLayerGetter:
        mods = list(children.values())
        return list(zip(mods, mods[1:], strict=False))
    if type(parent) is ResNet:
        return [(children["relu"], children["maxpool"])]
    return []


def pool_before_relu(model: nn.Module) -> int:
    """Where a ReLU feeds a max pool (ResNet's stem: at 480x640 its largest tensors), run the pool first and the
    ReLU on its output: the same values and gradients, without the ReLU's two passes (forward, backward) over the
    full-size map. A ReLU module that anything else also holds is left alone (its other use would change)."""
    holders: dict[int, int] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        holders[id(m)] = holders.get(id(m), 0) + 1
    moved = 0
    for parent in list(model.modules()):
        for relu, pool in _relu_pool_pairs(parent):
            if (type(relu) is nn.ReLU and type(pool) is nn.MaxPool2d and not pool.return_indices
                    and holders[id(relu)] == 1 and holders[id(pool)] == 1):
                relu.__class__, pool.__class__ = IdentityReLU, PoolThenReLU
                moved += 1
    return moved


def has_convs(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def channels_last(model: nn.Module) -> None:
    """Conv weights in channels-last: PyTorch then runs each conv, its backward and what follows in it."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)


def speed_up(model: nn.Module, keep_layout_because: str | None = None) -> dict:
    """Fold the frozen norms, move each ReLU that feeds a max pool after it and, where norms folded (ACT's ResNet),
    put the conv weights in channels-last (unless a reason to keep their layout is given); returns what was done
    (for the run record). A model without 2D convs is left as it is."""
    if not has_convs(model):
        return {"conv_layout": None, "frozen_norms_folded": 0, "relu_after_pool": 0}
    folded, moved = fold_frozen_norms(model), pool_before_relu(model)
    if not folded and keep_layout_because is None:  # channels-last alone did not help Diffusion's GroupNorm ResNet
        keep_layout_because = "no frozen-norm backbone: channels-last measured no faster (Diffusion, 96x96)"
    if keep_layout_because is None:
        channels_last(model)
    layout = "channels_last" if keep_layout_because is None else f"contiguous ({keep_layout_because})"
    return {"conv_layout": layout, "frozen_norms_folded": folded, "relu_after_pool": moved}
