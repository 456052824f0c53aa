"""Random-shift image augmentation (`TrainRecipe.image_shift`), as DrQ and Diffusion Policy train from pixels.

Each training image is moved by up to `shift` pixels along each axis, its border rows and columns repeated into
the gap (DrQ's replicate padding and random crop, done as one gather on the uint8 frames). The cube and the
gripper move together in a shifted picture, so what stays learnable is where they are relative to each other,
not their exact pixels: the usual remedy when a few hundred demonstrations let a pixel policy memorise.

The shifts are drawn per sample from (seed, step, sample key), like the flow-matching noise: the same sample
at the same step gets the same shift whichever rank trains it, so a resumed or data-parallel run sees exactly
the batches a single uninterrupted run sees. Only training batches are shifted; validation, evaluation and
serving read the pictures as recorded.
"""

from __future__ import annotations

import torch


def shifts(keys: list[int], step: int, seed: int, shift: int, cameras: int) -> torch.Tensor:
    """(N, cameras, 2) integer (dy, dx) offsets in [-shift, shift], one draw per sample key."""
    out = []
    for k in keys:
        g = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 10_000_019 + k) ^ 0x5EED5)
        out.append(torch.randint(-shift, shift + 1, (cameras, 2), generator=g))
    return torch.stack(out) if out else torch.zeros(0, cameras, 2, dtype=torch.long)


def shift_images(images: torch.Tensor, offsets: torch.Tensor, image_hw: torch.Tensor | None = None) -> torch.Tensor:
    """`images` (I, C, H, W) moved by `offsets` (I, 2) (dy, dx): output pixel (y, x) is input pixel
    (y + dy, x + dx), clamped to the image's own size (`image_hw` (I, 2), for cameras zero-padded to the largest;
    the padding stays as it was). Any dtype; a gather, no arithmetic on the values."""
    n, c, h, w = images.shape
    if n == 0:
        return images
    own = image_hw.to(images.device) if image_hw is not None and image_hw.numel() else \
        torch.tensor([h, w], device=images.device).expand(n, 2)
    offsets = offsets.to(images.device)
    ys, xs = torch.arange(h, device=images.device), torch.arange(w, device=images.device)
    rows = torch.minimum(torch.clamp(ys + offsets[:, :1], min=0), own[:, :1] - 1)  # (I, H)
    cols = torch.minimum(torch.clamp(xs + offsets[:, 1:], min=0), own[:, 1:] - 1)  # (I, W)
    rows = torch.where(ys < own[:, :1], rows, ys)  # rows past the image's own height: its padding, unchanged
    cols = torch.where(xs < own[:, 1:], cols, xs)
    i = torch.arange(n, device=images.device)[:, None, None, None]
    ch = torch.arange(c, device=images.device)[None, :, None, None]
    return images[i, ch, rows[:, None, :, None], cols[:, None, None, :]]
