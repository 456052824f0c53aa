"""Packed (varlen) vs padded batches: useful samples/s of a training step on CPU.

    python bench/packing.py [--samples 128] [--steps 2] [--preset small]

Data vary like real mixtures: 1-3 cameras and 8-96 instruction tokens per sample. All three
arms train the same model on the same samples, in the same order, with the same token budget
per batch; the padding is real compute, as in a padded dataloader. Two padded baselines:

- `padded_batch`: each batch pads its samples to the longest in that batch (cameras and
  instruction), and takes as many samples as fit the budget at that length (a collate_fn
  with `pad_sequence`, the usual dataloader);
- `padded_fixed`: every sample is padded to one fixed shape, 3 cameras and the longest
  instruction of the whole set (what a static-shape pipeline or `torch.compile` without
  dynamic shapes does).

Ends with one JSON line: `speedup` (packed / padded_batch useful samples/s), `speedup_vs_fixed`
(packed / padded_fixed), and the non-pad fraction of every arm's tokens.
"""

from __future__ import annotations

import argparse
import time

import torch
from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

from roboloop.training.config import PRESETS
from roboloop.training.model import VLAPolicy
from roboloop.training.packing import Sample, collate, nonpad_fraction, pack

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/packing.py", "roboloop/training", "roboloop/policies"]


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


def _pad_to(s: Sample, cams: int, text: int) -> Sample:
    pad_text = torch.zeros(text - s.instruction.numel(), dtype=torch.long)
    blank = [torch.zeros_like(s.images[0])] * (cams - len(s.images))
    return Sample(s.images + blank, torch.cat([s.instruction, pad_text]), s.state, s.actions, s.action_mask)


def padded_fixed(samples: list[Sample], budget: int, tpi: int, max_cams: int) -> list:
    """Fixed-shape batches: every sample padded to `max_cams` cameras' worth of tokens + the set's longest
    instruction."""
    longest = max(s.instruction.numel() for s in samples)
    per = max_cams * tpi + longest + 1
    bs = max(1, budget // per)
    return [collate([_pad_to(s, max_cams, longest) for s in samples[i:i + bs]], tpi)
            for i in range(0, len(samples), bs)]


def padded_batch(samples: list[Sample], budget: int, tpi: int) -> list:
    """Batches padded to their own longest sample: samples are added in order while (count x the batch's longest
    sample) stays within the token budget."""
    batches, cur = [], []

    def flush() -> None:
        cams = max(len(s.images) for s in cur)
        text = max(s.instruction.numel() for s in cur)
        batches.append(collate([_pad_to(s, cams, text) for s in cur], tpi))

    for s in samples:
        trial = [*cur, s]
        longest = max(len(x.images) for x in trial) * tpi + max(x.instruction.numel() for x in trial) + 1
        if cur and len(trial) * longest > budget:
            flush()
            cur = [s]
        else:
            cur = trial
    if cur:
        flush()
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
    arms = {"packed": list(pack(samples, args.max_tokens, tpi)),
            "padded_batch": padded_batch(samples, args.max_tokens, tpi),
            "padded_fixed": padded_fixed(samples, args.max_tokens, tpi, 3)}
    model = VLAPolicy(cfg)
    sps = {name: run(model, batches, args.steps) for name, batches in arms.items()}
    useful = sum(s.num_tokens(tpi) for s in samples)
    out = {"preset": args.preset, "samples": args.samples, "max_tokens": args.max_tokens,
           "speedup": round(sps["packed"] / sps["padded_batch"], 3),
           "speedup_vs_fixed": round(sps["packed"] / sps["padded_fixed"], 3),
           "nonpad_fraction": round(nonpad_fraction(arms["packed"], args.max_tokens), 4)}
    for name, batches in arms.items():
        out[f"{name}_samples_per_s"] = round(sps[name], 2)
        out[f"{name}_batches"] = len(batches)
        if name != "packed":
            out[f"{name}_nonpad_fraction"] = round(useful / sum(int(b.seq_lens.sum()) for b in batches), 4)
    emit(out, MEASURES)


if __name__ == "__main__":
    main()
