"""FP8 vs bf16 training step time and MFU at `base` and `n15` (needs a CUDA GPU, CC >= 8.9 for FP8).

    python bench/precision.py [--presets base n15] [--fp8-backend torchao|te] [--steps 20]

Synthetic packed batches (2 cameras, 16-64 instruction tokens) of `--max-tokens` tokens;
same model, same data, bf16 autocast vs FP8 on linears above the break-even size. Ends with
one JSON line: per preset step ms, MFU and `speedup` (bf16 step time / FP8 step time).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from roboloop.training import precision
from roboloop.training.config import PRESETS
from roboloop.training.model import VLAPolicy, num_parameters, train_flops
from roboloop.training.packing import Sample, pack


def batch(cfg, max_tokens: int):
    g = torch.Generator().manual_seed(0)
    h, w = cfg.image_size
    samples = [Sample([torch.rand(3, h, w, generator=g) for _ in range(2)],
                      torch.randint(0, 256, (int(torch.randint(16, 65, (1,), generator=g)),), generator=g),
                      torch.randn(cfg.state_dim, generator=g), torch.randn(cfg.horizon, cfg.action_dim, generator=g),
                      torch.ones(cfg.horizon, dtype=torch.bool)) for _ in range(512)]
    return next(pack(samples, max_tokens, cfg.tokens_per_image)).to("cuda")


def step_time(preset: str, mode: str, backend: str, steps: int, max_tokens: int) -> dict:
    cfg = PRESETS[preset]()
    torch.manual_seed(0)
    model = VLAPolicy(cfg).cuda()
    plan = precision.PrecisionPlan(mode, "bench", backend if mode == "fp8" else None)
    converted = precision.apply_fp8(model, plan)
    if mode == "fp8" and backend == "torchao":
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    b = batch(cfg, max_tokens)
    for i in range(steps + 5):
        if i == 5:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        with plan.autocast("cuda"), precision.fp8_context(plan):
            loss = model.loss(b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    flops = train_flops(cfg, b.seq_lens.tolist(), int(b.images.shape[0]))
    peak = precision.peak_flops(torch.device("cuda"), "bf16")  # MFU against the bf16 peak in both modes
    return {"step_ms": round(dt * 1e3, 2), "params_b": round(num_parameters(model) / 1e9, 3),
            "fp8_linears": converted, "mfu": round(flops / dt / peak, 4) if peak else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="+", default=["base", "n15"])
    ap.add_argument("--fp8-backend", default="torchao", choices=["torchao", "te"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=8192)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/precision.py needs a CUDA GPU")
    precision.plan("fp8", "cuda", args.fp8_backend)  # fails early, saying what is missing
    out = {"device": torch.cuda.get_device_name(), "fp8_backend": args.fp8_backend}
    for preset in args.presets:
        bf16 = step_time(preset, "bf16", args.fp8_backend, args.steps, args.max_tokens)
        fp8 = step_time(preset, "fp8", args.fp8_backend, args.steps, args.max_tokens)
        out[preset] = {"bf16": bf16, "fp8": fp8, "speedup": round(bf16["step_ms"] / fp8["step_ms"], 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
