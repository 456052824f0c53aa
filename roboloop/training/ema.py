"""An exponential moving average of the weights (Polyak averaging), kept beside the trained ones.

Late checkpoints of a behaviour-cloning run can differ a lot in closed-loop success while their losses barely
move (the SO-101 sweep in docs/guides/so101.md: 2-52% between checkpoints 250 steps apart); averaging the
weights over the last few hundred steps is the usual remedy (LeRobot's Diffusion Policy and most BC recipes keep an
EMA). The average never feeds back into training: the optimiser steps the raw weights, the final model and every
checkpoint's export hold the averaged ones, and checkpoints carry the average so a resumed run continues it.
"""

from __future__ import annotations

import torch
from torch import nn


class WeightAverage:
    """`shadow <- d * shadow + (1 - d) * weights` after each optimiser step, with `d = min(decay, (1 + n) /
    (10 + n))` at the n-th update (the usual warm-up: early averages are not dominated by the initial weights).
    Float32 copies of the trainable floating-point parameters, on their device; buffers are not averaged."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema_decay must be in (0, 1), got {decay}")
        self.decay, self.updates = decay, 0
        self._params = {n: p for n, p in model.named_parameters() if p.requires_grad and p.is_floating_point()}
        self.shadow = {n: p.detach().float().clone() for n, p in self._params.items()}

    def rate(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self) -> None:
        """After an optimiser step of the model this average was made for (its parameters, updated in place)."""
        current = [p.detach().float() for p in self._params.values()]
        torch._foreach_lerp_(list(self.shadow.values()), current, 1.0 - self.rate())
        self.updates += 1

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict) -> None:
        missing = set(self.shadow) ^ set(state["shadow"])
        if missing:
            raise ValueError(f"the checkpoint's weight average does not fit this model ({sorted(missing)[:3]} ...)")
        self.updates = int(state["updates"])
        for n, v in state["shadow"].items():
            self.shadow[n].copy_(v)


def averaged(state: dict[str, torch.Tensor], ema_state: dict | None) -> dict[str, torch.Tensor]:
    """A model state dict with the average in place of the trained parameters (each in its own dtype and
    device); unchanged when there is no average."""
    if not ema_state:
        return state
    shadow = ema_state["shadow"]
    return {k: shadow[k].to(device=v.device, dtype=v.dtype) if k in shadow else v for k, v in state.items()}
