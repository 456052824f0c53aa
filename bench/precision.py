"""FP8 vs bf16 training step time and MFU at `base` and `n15` (needs a CUDA GPU, CC >= 8.9 for FP8).

    python bench/precision.py [--presets base n15] [--fp8-backend torchao|te] [--steps 20] [--compile]
    python bench/precision.py --grid [--fp8-backend torchao]   # per-linear break-even on this GPU

Synthetic packed batches (2 cameras, 16-64 instruction tokens) of `--max-tokens` tokens;
same model, same data, bf16 autocast vs FP8 on linears above the threshold. Baseline: the bf16
arm, compiled exactly when the FP8 arm is (`--compile` compiles both; without it neither is),
so the ratio is FP8's alone. Ends with one JSON line: per preset step ms, MFU and `speedup`
(bf16 step time / FP8 step time).

`--grid` times forward+backward of one linear (tokens x features x features) in FP8 and in
bf16 over a grid of widths, prints each ratio and the smallest width from which FP8 is faster
at every larger one, and records it for this GPU model in the cache dir's
`fp8_thresholds.json`, eager or `--compile`d (the key `<GPU name>|compiled`; null where FP8 was never
faster): a run that trains its blocks compiled (train.compile) uses the compiled grid, an eager run the eager
one, instead of the documented default, and `precision=auto` picks FP8 only on a GPU model recorded faster
for how the run trains. `--recipe rowwise` measures torchao's rowwise scaling (recorded with the grid).
Measured on an H200 (torchao 0.18, 8192 tokens, eager): FP8 0.11-0.54x of bf16 at every width from 256 to
8192; a whole `base` step 0.19x eager and 0.83x with `--compile` (the whole loss compiled; the trainer now
compiles per block). The compiled grid is pending a GPU (`make gpu-check`).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

from roboloop.training import precision
from roboloop.training.config import PRESETS
from roboloop.training.model import VLAPolicy, num_parameters, train_flops
from roboloop.training.packing import Sample, pack

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/precision.py", "roboloop/training"]


def batch(cfg, max_tokens: int):
    g = torch.Generator().manual_seed(0)
    h, w = cfg.image_size
    samples = [Sample([torch.rand(3, h, w, generator=g) for _ in range(2)],
                      torch.randint(0, 256, (int(torch.randint(16, 65, (1,), generator=g)),), generator=g),
                      torch.randn(cfg.state_dim, generator=g), torch.randn(cfg.horizon, cfg.action_dim, generator=g),
                      torch.ones(cfg.horizon, dtype=torch.bool)) for _ in range(512)]
    return next(pack(samples, max_tokens, cfg.tokens_per_image)).to("cuda")


def step_time(preset: str, mode: str, backend: str, steps: int, max_tokens: int, compile_: bool) -> dict:
    cfg = PRESETS[preset]()
    torch.manual_seed(0)
    model = VLAPolicy(cfg).cuda()
    plan = precision.PrecisionPlan(mode, "bench", backend if mode == "fp8" else None)
    converted = precision.apply_fp8(model, plan)
    # both arms or neither: the ratio is FP8's, not the compiler's. The loss is what runs, so the loss is what
    # is compiled (`torch.compile(model)` would compile only `forward`, which `model.loss` does not go through)
    loss_fn = torch.compile(model.loss) if compile_ else model.loss
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    b = batch(cfg, max_tokens)
    for i in range(steps + 5):
        if i == 5:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        with plan.autocast("cuda"), precision.fp8_context(plan):
            loss = loss_fn(b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    flops = train_flops(cfg, b.seq_lens.tolist(), int(b.images.shape[0]))
    peak = precision.peak_flops(torch.device("cuda"), "bf16")  # MFU against the bf16 peak in both modes
    return {"step_ms": round(dt * 1e3, 2), "params_b": round(num_parameters(model) / 1e9, 3),
            "fp8_linears": converted, "mfu": round(flops / dt / peak, 4) if peak else None, "compiled": compile_}


def linear_ms(features: int, tokens: int, mode: str, backend: str, compile_: bool, iters: int = 20,
              recipe: str = "tensorwise") -> float:
    """ms of forward + backward of one (features x features) linear on `tokens` tokens."""
    lin = torch.nn.Sequential(torch.nn.Linear(features, features, bias=False)).cuda()
    plan = precision.PrecisionPlan(mode, "bench", backend if mode == "fp8" else None)
    precision.apply_fp8(lin, plan, min_features=16, recipe=recipe)
    f = torch.compile(lin) if compile_ else lin
    x = torch.randn(tokens, features, device="cuda", requires_grad=True)
    for i in range(iters + 3):
        if i == 3:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        with plan.autocast("cuda"), precision.fp8_context(plan):
            y = f(x)
        y.float().sum().backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def grid(backend: str, tokens: int, compile_: bool, recipe: str = "tensorwise") -> dict:
    from pathlib import Path

    from roboloop import fsutil
    from roboloop.settings import settings

    rows = {}
    for feats in (256, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192):
        bf = linear_ms(feats, tokens, "bf16", backend, compile_)
        f8 = linear_ms(feats, tokens, "fp8", backend, compile_, recipe=recipe)
        rows[feats] = round(bf / f8, 3)
        print(f"linear {feats}x{feats}, {tokens} tokens: bf16 {bf:.3f} ms, fp8 {f8:.3f} ms, speedup {bf / f8:.2f}",
              flush=True)
    wins = sorted(rows)
    threshold = next((w for i, w in enumerate(wins) if all(rows[v] > 1.0 for v in wins[i:])), None)
    name = torch.cuda.get_device_name()
    f = Path(settings().cache_dir) / precision.FP8_THRESHOLDS_FILE  # null: FP8 never faster here
    known = json.loads(f.read_text()) if f.is_file() else {}
    f.parent.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_json(f, {**known, precision.grid_key(name, compile_): threshold})
    return {"device": name, "fp8_backend": backend, "fp8_recipe": recipe, "tokens": tokens, "compiled": compile_,
            "speedup_by_features": rows, "break_even_features": threshold,
            "note": ("FP8 never faster on this grid" if threshold is None else f"FP8 faster from {threshold} features")
            + f"; recorded for {'compiled' if compile_ else 'eager'} training (precision=auto follows it)"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="+", default=["base", "n15"])
    ap.add_argument("--fp8-backend", default="torchao", choices=["torchao", "te"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--compile", action="store_true", help="torch.compile both arms (default: neither)")
    ap.add_argument("--grid", action="store_true", help="measure the per-linear break-even and record it")
    ap.add_argument("--recipe", default="tensorwise", choices=["tensorwise", "rowwise", "rowwise_with_gw_hp"])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/precision.py needs a CUDA GPU")
    precision.plan("fp8", "cuda", args.fp8_backend)  # fails early, saying what is missing
    if args.grid:
        print(json.dumps(grid(args.fp8_backend, args.max_tokens, args.compile, args.recipe)))
        return
    out = {"device": torch.cuda.get_device_name(), "fp8_backend": args.fp8_backend, "compiled": args.compile,
           "baseline": "bf16 autocast, same model, data and compilation"}
    for preset in args.presets:
        bf16 = step_time(preset, "bf16", args.fp8_backend, args.steps, args.max_tokens, args.compile)
        fp8 = step_time(preset, "fp8", args.fp8_backend, args.steps, args.max_tokens, args.compile)
        out[preset] = {"bf16": bf16, "fp8": fp8, "speedup": round(bf16["step_ms"] / fp8["step_ms"], 3)}
    emit(out, MEASURES)


if __name__ == "__main__":
    main()
