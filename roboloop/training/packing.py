"""Packing variable-length samples into a fixed token budget.

A sample's backbone sequence is [vision tokens of each camera | instruction tokens | state
token(s)]; cameras and instruction lengths vary, so padding a batch to its longest sample
wastes compute. Packing concatenates samples along the token axis up to `max_tokens` and
records `cu_seqlens` (where each sample starts) and per-token position ids; attention
never crosses a sample boundary (see `attention.varlen_attention`). The loss is computed
per sample from its own action chunk, masked where the chunk runs past the episode end.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Sample:
    """One training example before tokenisation (tensors on CPU)."""

    images: list[torch.Tensor]  # each (3, H, W): uint8 RGB, or float in [0, 1]; any number of cameras
    instruction: torch.Tensor  # (L,) int64 token ids
    state: torch.Tensor  # (S,) float
    actions: torch.Tensor  # (H, A) float, the chunk to predict
    action_mask: torch.Tensor  # (H,) bool, False past the episode end
    aux: torch.Tensor | None = None  # (E,) auxiliary training target (privileged state), if the recipe has one
    # history policies: (n_obs, S) raw states, oldest first (each image is then (3 * n_obs, H, W), oldest first)
    state_hist: torch.Tensor | None = None
    env_state: torch.Tensor | None = None  # (E,) or, with history, (n_obs, E): observation.environment_state, raw

    def num_tokens(self, tokens_per_image: int, state_tokens: int = 1) -> int:
        return len(self.images) * tokens_per_image + int(self.instruction.numel()) + state_tokens


@dataclass
class PackedBatch:
    """A pack of samples. Images are stacked (num_images, 3, H, W) with their owner sample: uint8 when every
    image is (colour frames travel to the device as decoded), else float in [0, 1]; models read `image_input`."""

    images: torch.Tensor
    image_sample: torch.Tensor  # (num_images,) which sample each image belongs to
    image_camera: torch.Tensor  # (num_images,) camera slot within its sample
    tokens: torch.Tensor  # (num_text,) instruction ids, concatenated
    token_sample: torch.Tensor  # (num_text,)
    token_pos: torch.Tensor  # (num_text,) position within the instruction
    states: torch.Tensor  # (N, S)
    actions: torch.Tensor  # (N, H, A)
    action_mask: torch.Tensor  # (N, H)
    seq_lens: torch.Tensor  # (N,) backbone tokens per sample
    aux: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0))  # (N, E) auxiliary targets; E = 0: none
    # (num_images, 2) each image's own (H, W): cameras of different sizes are zero-padded to the largest
    image_hw: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 2, dtype=torch.long))
    states_hist: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, 0))  # (N, n_obs, S); empty: none
    # (N, E) or (N, n_obs, E) observation.environment_state where the policy reads it; empty: none
    env_state: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0))

    @property
    def num_samples(self) -> int:
        return int(self.states.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        return PackedBatch(**{k: v.to(device, non_blocking=non_blocking) for k, v in vars(self).items()})

    def image_input(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The images as a model reads them, in [0, 1]: uint8 is scaled here, on the batch's device (float32
        division, then `dtype`: the values `cameras.to_model_input` gives on the host)."""
        if self.images.dtype == torch.uint8:
            return self.images.float().div_(255).to(dtype)
        return self.images.to(dtype)

    def pin_memory(self) -> PackedBatch:
        return PackedBatch(**{k: v.pin_memory() for k, v in vars(self).items()})


def collate(samples: Sequence[Sample], tokens_per_image: int, state_tokens: int = 1) -> PackedBatch:
    images, img_sample, img_cam, toks, tok_sample, tok_pos = [], [], [], [], [], []
    for i, s in enumerate(samples):
        for c, img in enumerate(s.images):
            images.append(img)
            img_sample.append(i)
            img_cam.append(c)
        toks.append(s.instruction)
        tok_sample.append(torch.full((s.instruction.numel(),), i, dtype=torch.long))
        tok_pos.append(torch.arange(s.instruction.numel()))
    hw = torch.tensor([img.shape[-2:] for img in images], dtype=torch.long).reshape(-1, 2)
    if len({img.dtype for img in images}) > 1:  # depth (float) beside colour (uint8): one float stack
        images = [img.float().div_(255) if img.dtype == torch.uint8 else img for img in images]
    if images and (hw != hw[0]).any():  # cameras at their own resolutions: pad to the largest, keep the sizes
        h, w = int(hw[:, 0].max()), int(hw[:, 1].max())
        images = [torch.nn.functional.pad(img, (0, w - img.shape[-1], 0, h - img.shape[-2])) for img in images]
    return PackedBatch(
        images=torch.stack(images) if images else torch.zeros(0, 3, 1, 1),
        image_hw=hw,
        states_hist=torch.stack([s.state_hist for s in samples]) if samples and samples[0].state_hist is not None
        else torch.zeros(0, 0, 0),
        image_sample=torch.tensor(img_sample, dtype=torch.long),
        image_camera=torch.tensor(img_cam, dtype=torch.long),
        tokens=torch.cat(toks) if toks else torch.zeros(0, dtype=torch.long),
        token_sample=torch.cat(tok_sample) if tok_sample else torch.zeros(0, dtype=torch.long),
        token_pos=torch.cat(tok_pos) if tok_pos else torch.zeros(0, dtype=torch.long),
        states=torch.stack([s.state for s in samples]),
        actions=torch.stack([s.actions for s in samples]),
        action_mask=torch.stack([s.action_mask for s in samples]),
        seq_lens=torch.tensor([s.num_tokens(tokens_per_image, state_tokens) for s in samples], dtype=torch.int32),
        aux=torch.stack([s.aux for s in samples]) if samples and samples[0].aux is not None
        else torch.zeros(len(samples), 0),
        env_state=torch.stack([s.env_state for s in samples]) if samples and samples[0].env_state is not None
        else torch.zeros(len(samples), 0),
    )


def pack(samples: Iterable[Sample], max_tokens: int, tokens_per_image: int,
         max_samples: int | None = None, open_bins: int = 4, state_tokens: int = 1) -> Iterator[PackedBatch]:
    """First-fit over a few open packs: a sample goes into the first open pack it fits in; when
    none has room and `open_bins` are open, the fullest pack is emitted. More open packs fill
    packs tighter at the cost of reordering samples a little (bounded by `open_bins`)."""
    bins: list[tuple[list[Sample], int]] = []
    for s in samples:
        n = s.num_tokens(tokens_per_image, state_tokens)
        if n > max_tokens:
            raise ValueError(f"a sample needs {n} tokens, more than the pack budget max_tokens={max_tokens}")
        for i, (members, used) in enumerate(bins):
            if used + n <= max_tokens and (max_samples is None or len(members) < max_samples):
                members.append(s)
                bins[i] = (members, used + n)
                break
        else:
            if len(bins) >= open_bins:
                fullest = max(range(len(bins)), key=lambda i: bins[i][1])
                yield collate(bins.pop(fullest)[0], tokens_per_image, state_tokens)
            bins.append(([s], n))
    for members, _ in sorted(bins, key=lambda b: -b[1]):
        yield collate(members, tokens_per_image, state_tokens)


def nonpad_fraction(batches: Sequence[PackedBatch], max_tokens: int) -> float:
    """Useful tokens / budgeted tokens over a run of packs."""
    used = sum(int(b.seq_lens.sum()) for b in batches)
    return used / (max_tokens * max(len(batches), 1))
