"""Packed (varlen) vs padded batches: useful samples/s of a training step on CPU.

    python bench/packing.py [--samples 128] [--steps 2] [--preset small]

Data vary like real mixtures: 1-3 cameras and 8-96 instruction tokens per sample. Both
sides train the same model on the same samples with the same token budget; padded batches
pad every sample to the longest in its batch (the padding is real compute, as in a padded
dataloader). Ends with one JSON line: `speedup` (packed / padded useful samples/s) and
`nonpad_fraction` of the packed batches.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from roboloop.training.config import PRESETS
from roboloop.training.model import VLAPolicy
from roboloop.training.packing import Sample, collate, nonpad_fraction, pack


def make_samples(n: int, cfg, seed: int = 0) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    h, w = cfg.image_size
    out = []
    for _ in range(n):
        cams = int(torch.randint(1, 4, (1,), generator=g))
        length = int(torch.randint(8, 97, (1,), generator=g))
        out.append(Sample(images=[torch.rand(3, h, w, generator=g) for _ in range(cams)],
                          instruction=torch.randint(0, 256, (length,), generator=g),
                          state=torch.randn(cfg.state_dim, generator=g),
                          actions=torch.randn(cfg.horizon, cfg.action_dim, generator=g),
                          action_mask=torch.ones(cfg.horizon, dtype=torch.bool)))
    return out


def padded(samples: list[Sample], budget: int, tpi: int, max_cams: int) -> list:
    """Fixed-shape batches: every sample padded to 3 cameras' worth of tokens + the longest instruction."""
    longest = max(s.instruction.numel() for s in samples)
    per = max_cams * tpi + longest + 1
    bs = max(1, budget // per)
    batches = []
    for i in range(0, len(samples), bs):
        chunk = []
        for s in samples[i:i + bs]:
            pad_text = torch.zeros(longest - s.instruction.numel(), dtype=torch.long)
            blank = [torch.zeros_like(s.images[0])] * (max_cams - len(s.images))
            chunk.append(Sample(s.images + blank, torch.cat([s.instruction, pad_text]),
                                s.state, s.actions, s.action_mask))
        batches.append(collate(chunk, tpi))
    return batches


def run(model, batches, steps: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n = sum(b.num_samples for b in batches)
    for b in batches[:1]:  # warm-up
        model.loss(b).backward()
    t0 = time.perf_counter()
    for _ in range(steps):
        for b in batches:
            opt.zero_grad()
            model.loss(b).backward()
            opt.step()
    return n * steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--max-tokens", type=int, default=1024)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = PRESETS[args.preset](image_size=(64, 64), patch_size=16)
    samples = make_samples(args.samples, cfg)
    tpi = cfg.tokens_per_image
    packed_batches = list(pack(samples, args.max_tokens, tpi))
    padded_batches = padded(samples, args.max_tokens, tpi, 3)
    model = VLAPolicy(cfg)
    packed_sps = run(model, packed_batches, args.steps)
    padded_sps = run(model, padded_batches, args.steps)
    useful = sum(s.num_tokens(tpi) for s in samples)
    padded_tokens = sum(int(b.seq_lens.sum()) for b in padded_batches)
    print(json.dumps({
        "preset": args.preset, "samples": args.samples, "max_tokens": args.max_tokens,
        "packed_samples_per_s": round(packed_sps, 2), "padded_samples_per_s": round(padded_sps, 2),
        "speedup": round(packed_sps / padded_sps, 3),
        "nonpad_fraction": round(nonpad_fraction(packed_batches, args.max_tokens), 4),
        "padded_nonpad_fraction": round(useful / padded_tokens, 4),
        "packed_batches": len(packed_batches), "padded_batches": len(padded_batches),
    }))


if __name__ == "__main__":
    main()
