"""Activation checkpointing's memory saving: one packed batch's forward and backward pass of a VLA preset, with and
without `train.activation_checkpointing`, each arm in its own process.

    python bench/activations.py [--preset small] [--max-tokens 4096] [--smoke]

Measured, per arm: the bytes the forward pass keeps for the backward pass (every tensor autograd saves and every
block's input, counted once per storage, the weights left out: the activations), the process's peak RSS (what the
machine had to hold: weights, gradients, activations and the allocator's slack), the time of the pass, and the
largest gradient difference between the arms (0: the same gradients). Baseline: the same pass without checkpointing;
`saved_ratio` and `peak_rss_ratio` are with / without. On a GPU the activations are the part of memory that grows
with the per-GPU batch, so `saved_ratio` is the figure that carries over: the larger step it leaves room for (the
CPU's peak RSS also holds the allocator's slack). The recomputation costs about one more forward pass
(`time_ratio`).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/activations.py", "roboloop/training/recompute.py", "roboloop/training/model.py"]


def arm(preset: str, max_tokens: int, checkpointing: bool) -> dict:
    """One pass in this process: saved bytes, peak RSS, time, and the gradients' checksum per parameter."""
    import torch

    from roboloop.training import compiled, recompute
    from roboloop.training.config import PRESETS
    from roboloop.training.model import VLAPolicy
    from roboloop.training.packing import Sample, pack

    torch.manual_seed(0)
    cfg = PRESETS[preset]()
    model = VLAPolicy(cfg)
    if checkpointing:
        recompute.apply(compiled.regions(model))
    g = torch.Generator().manual_seed(0)
    h, w = cfg.image_size
    samples = [Sample([torch.rand(3, h, w, generator=g) for _ in range(2)],
                      torch.randint(0, 256, (int(torch.randint(16, 65, (1,), generator=g)),), generator=g),
                      torch.randn(cfg.state_dim, generator=g), torch.randn(cfg.horizon, cfg.action_dim, generator=g),
                      torch.ones(cfg.horizon, dtype=torch.bool)) for _ in range(512)]
    batch = next(pack(samples, max_tokens, cfg.tokens_per_image))
    seen: dict[int, int] = {}

    def keep(t):
        if t.device.type == "cpu" and t.untyped_storage().data_ptr() not in seen:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    for block in compiled.regions(model):  # what checkpointing keeps: each block's inputs (held for the recompute)
        block.register_forward_pre_hook(lambda _m, args: None if [keep(a) for a in args
                                                                  if isinstance(a, torch.Tensor)] else None)
    torch.manual_seed(1)
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        loss = model.loss(batch)
    loss.backward()
    dt = time.perf_counter() - t0
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}  # saved weights are not activations
    saved = sum(n for ptr, n in seen.items() if ptr not in weights)
    return {"saved_bytes": saved, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "pass_s": round(dt, 3), "samples": len(batch.seq_lens), "tokens": int(batch.seq_lens.sum()),
            "grads": {n: float(p.grad.double().sum()) for n, p in model.named_parameters() if p.grad is not None}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--smoke", action="store_true", help="preset tiny, 512 tokens (the test suite's run)")
    ap.add_argument("--arm", choices=["off", "on"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        args.preset, args.max_tokens = "tiny", 512
    if args.arm:
        print(json.dumps(arm(args.preset, args.max_tokens, args.arm == "on")))
        return
    runs = {}
    for name in ("off", "on"):  # each in a fresh process: its peak RSS is its own
        done = subprocess.run([sys.executable, __file__, "--preset", args.preset, "--max-tokens",
                               str(args.max_tokens), "--arm", name], capture_output=True, text=True, check=True)
        runs[name] = json.loads(done.stdout.strip().splitlines()[-1])
    off, on = runs["off"], runs["on"]
    grad_diff = max(abs(off["grads"][k] - on["grads"][k]) / max(1e-12, abs(off["grads"][k])) for k in off["grads"])
    for r in runs.values():
        r.pop("grads")
    emit({"preset": args.preset, "max_tokens": args.max_tokens, "baseline": "the same pass without checkpointing",
          "off": off, "on": on, "saved_ratio": round(on["saved_bytes"] / off["saved_bytes"], 3),
          "peak_rss_ratio": round(on["peak_rss_bytes"] / off["peak_rss_bytes"], 3),
          "time_ratio": round(on["pass_s"] / off["pass_s"], 3), "grad_max_rel_diff": grad_diff}, MEASURES)


if __name__ == "__main__":
    main()
