"""Activation checkpointing per block: a block's forward pass keeps only its inputs, and the backward pass runs it
again to get the activations it needs (torch.utils.checkpoint, non-reentrant), so the memory of the activations is
that of one block instead of all of them. The blocks are the compiled regions (`compiled.regions`: the VLA's
transformer blocks, LeRobot's layers); their parameters and state_dict keys are unchanged (the forward is wrapped in
place, not the module), so checkpoints and model folders are the same files with it on or off. Recomputation draws
dropout's masks from the generator state the first pass saw (preserve_rng_state), so the gradients are the ones
without it."""

from __future__ import annotations

from torch import nn
from torch.utils.checkpoint import checkpoint


def apply(blocks: list[nn.Module]) -> int:
    """Recompute each block's activations in the backward pass; returns how many blocks (before FSDP/DDP wrap)."""
    for block in blocks:
        inner = block.forward

        def recomputed(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = recomputed  # type: ignore[method-assign]
    return len(blocks)
