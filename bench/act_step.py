"""Where a training step of LeRobot's ACT goes on this machine: the model alone (no loader), LeRobot's way and
roboloop's, and what the convolutions leave to any engine.

    python bench/act_step.py [--height 480 --width 640] [--batch 4] [--steps 8] [--precision bf16|fp32]

The ACT of `bench/lerobot_train.py` (dim 256, ResNet-18 from scratch, one camera at HxW, chunk 20), one batch of
random frames, each variant on its own copy of the same initial weights, timed step by step in turn (this VM's
speed drifts between runs, less between neighbouring steps: each ratio is the median over rounds of the two
variants' steps in the same round). LeRobot's variants run in a process of their own with glibc's allocator as
`lerobot-train` has it, roboloop's in this one with the allocator as roboloop's trainer sets it on a CPU
(`host_memory` keep, `roboloop.training.hostmem`: with glibc's defaults every activation above its mmap threshold
is unmapped when freed and faulted in again, zeroed page by page, on the next step); the two processes never
run at once:
- `lerobot_fp32`: LeRobot's ACT as `lerobot-train` runs it by default (fp32, `torch.optim.AdamW`'s defaults);
- `lerobot_bf16`: the same under bf16 autocast (`--policy.use_amp=true`);
- `roboloop`: the model as roboloop's trainer runs it at `--precision` (frozen norms folded into their convs,
  channels-last: `roboloop.training.convs`; the fused AdamW: `roboloop.training.optim`);
- `roboloop_no_dropout`: the same with every dropout at p = 0, a what-if (not a training setting) that prices
  LeRobot's dropout (its masks are drawn one element at a time by `bernoulli_`).
Then PyTorch's profiler over a few `roboloop` steps splits its CPU time by operator: the convolutions (forward and
backward), the dropout masks, the matmuls, the optimizer, the rest. `conv_ms` is the convolutions' share of the
median step; `conv_gflops_per_s` their arithmetic (2 x N x Cout x Hout x Wout x Cin/groups x kh x kw per
forward, twice that backward, once for the first conv whose input needs no gradient) over that time.
`ceiling_vs_lerobot_fp32` = lerobot_fp32's step / conv_ms: what any engine could reach against LeRobot's default
on this machine, model and batch if everything but the convolutions took no time (the convolutions run at what
oneDNN does; `bench/lerobot_train.py`'s ratio is against lerobot-train's whole step, its loader's share too).
Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.lerobot_train import ACT as CONFIG  # noqa: E402  (the ACT that bench trains)

CATEGORIES = {"convolutions": ("aten::mkldnn_convolution", "aten::convolution_backward", "aten::_convolution",
                               "aten::convolution_overrideable", "aten::cudnn_convolution"),
              "dropout masks": ("aten::bernoulli_",),
              "matmuls": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
              "optimizer": ("aten::_fused_adamw_",)}  # roboloop's AdamW on CPU (roboloop.training.optim)

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/act_step.py", "roboloop/policies", "roboloop/training"]


def build(h: int, w: int, batch: int):
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    torch.manual_seed(0)
    policy = ACTPolicy(ACTConfig(input_features={
        "observation.state": PolicyFeature(FeatureType.STATE, (6,)),
        "observation.images.front": PolicyFeature(FeatureType.VISUAL, (3, h, w))},
        output_features={"action": PolicyFeature(FeatureType.ACTION, (6,))}, pretrained_backbone_weights=None,
        device="cpu", **CONFIG)).train()
    c = CONFIG["chunk_size"]
    data = {"observation.state": torch.randn(batch, 6), "observation.images.front": torch.rand(batch, 3, h, w),
            "action": torch.randn(batch, c, 6), "action_is_pad": torch.zeros(batch, c, dtype=torch.bool)}
    return policy, data


class Variant:
    def __init__(self, name: str, policy, bf16: bool, roboloop: bool, dropout: bool = True):
        import torch
        from torch import nn

        from roboloop.training import convs, optim

        self.name, self.policy, self.bf16, self.times = name, policy, bf16, []
        if policy is None:  # stepped in the LeRobot process (`lerobot_process`); only its times are here
            return
        if roboloop:
            self.done = convs.speed_up(policy)
            self.opt, self.optimizer = optim.adamw(policy.parameters(), 1e-5, 1e-4)
        else:
            self.done = {}
            self.opt, self.optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5, weight_decay=1e-4), "default"
        if not dropout:
            for m in policy.modules():
                if isinstance(m, nn.Dropout):
                    m.p = 0.0
                elif isinstance(m, nn.MultiheadAttention):
                    m.dropout = 0.0

    def step(self, data: dict) -> float:
        import torch

        t = time.perf_counter()
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()
        with ctx:
            loss, _ = self.policy.forward(data)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 10.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t


def lerobot_process(conn, h: int, w: int, batch: int) -> None:
    """LeRobot's two variants, in a process whose allocator is glibc's as lerobot-train has it: one step of each
    per "step" received, their times sent back."""
    base, data = build(h, w, batch)
    variants = [Variant("lerobot_fp32", copy.deepcopy(base), False, False),
                Variant("lerobot_bf16", copy.deepcopy(base), True, False)]
    while conn.recv() == "step":
        conn.send([v.step(data) for v in variants])


def conv_flops(policy, data: dict) -> float:
    """Forward and backward arithmetic of every Conv2d in one step (shapes recorded by forward hooks)."""
    import torch
    from torch import nn

    fwd: list[tuple[float, bool]] = []

    def hook(m, inputs, out):
        kh, kw = m.kernel_size
        fwd.append((2.0 * out.numel() * (m.in_channels // m.groups) * kh * kw, inputs[0].requires_grad))

    hooks = [m.register_forward_hook(hook) for m in policy.modules() if isinstance(m, nn.Conv2d)]
    try:
        with torch.enable_grad():  # the activations need gradients (which convs compute the input's), the frame not
            policy.forward(data)
    finally:
        for h in hooks:
            h.remove()
    # backward: the weight's gradient always, the input's where it needs one (not the camera frame itself)
    return sum(f * (3.0 if needs_grad else 2.0) for f, needs_grad in fwd)


def profile(variant: Variant, data: dict, steps: int) -> dict[str, float]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU], acc_events=True) as p:
        for _ in range(steps):
            variant.step(data)
    by_op = {e.key: e.self_cpu_time_total for e in p.key_averages()}
    total = sum(by_op.values())
    shares = {c: sum(v for k, v in by_op.items() if k in ops) / total for c, ops in CATEGORIES.items()}
    shares["rest"] = 1.0 - sum(shares.values())
    return {k: round(v, 4) for k, v in shares.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12, help="timed steps of each variant (after two warm-up steps)")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16", help="roboloop's variants")
    args = ap.parse_args()
    import torch

    from roboloop.training import hostmem

    lerobot_side, conn = multiprocessing.get_context("spawn").Pipe()
    child = multiprocessing.get_context("spawn").Process(target=lerobot_process,
                                                         args=(conn, args.height, args.width, args.batch))
    child.start()
    host_memory = hostmem.apply("auto", "cpu")  # as roboloop's trainer, before the model
    base, data = build(args.height, args.width, args.batch)
    bf16 = args.precision == "bf16"
    lerobot = [Variant("lerobot_fp32", None, False, False), Variant("lerobot_bf16", None, True, False)]
    variants = [*lerobot, Variant("roboloop", copy.deepcopy(base), bf16, True),
                Variant("roboloop_no_dropout", copy.deepcopy(base), bf16, True, dropout=False)]
    try:
        for r in range(2 + args.steps):  # two warm-up rounds
            lerobot_side.send("step")
            times = lerobot_side.recv()
            for v in variants[2:]:
                times.append(v.step(data))
            if r >= 2:
                for v, t in zip(variants, times, strict=True):
                    v.times.append(t)
    finally:
        lerobot_side.send("stop")
        child.join()
    step_ms = {v.name: round(statistics.median(v.times) * 1e3, 1) for v in variants}
    ours = variants[2]

    def paired(a: Variant, b: Variant) -> float:  # median over rounds of a's step / b's in the same round
        return statistics.median(x / y for x, y in zip(a.times, b.times, strict=True))

    shares = profile(ours, data, args.profile_steps)
    conv_ms = shares["convolutions"] * step_ms["roboloop"]
    flops = conv_flops(ours.policy, data)
    out = {"camera": f"{args.height}x{args.width}", "batch": args.batch, "precision": args.precision,
           "threads": torch.get_num_threads(), "config": CONFIG, "step_ms": step_ms,
           "roboloop_did": {**ours.done, "optimizer": ours.optimizer, "host_memory": host_memory},
           "lerobot_host_memory": "system (glibc's defaults, as lerobot-train runs; a process of its own)",
           "roboloop_vs_lerobot_fp32": round(paired(variants[0], ours), 2),
           "roboloop_vs_lerobot_bf16": round(paired(variants[1], ours), 2),
           "dropout_share": round(1 - paired(variants[3], ours), 3),
           "roboloop_profile_shares": shares, "conv_ms": round(conv_ms, 1),
           "conv_gflops_per_s": round(flops / (conv_ms / 1e3) / 1e9, 1),
           "ceiling_vs_lerobot_fp32": round(step_ms["lerobot_fp32"] / conv_ms, 2)}
    for name, ms in step_ms.items():
        print(f"{name:>20}: {ms:8.1f} ms a step")
    print(f"roboloop's step: {', '.join(f'{k} {v:.0%}' for k, v in shares.items())}; convolutions "
          f"{out['conv_ms']} ms at {out['conv_gflops_per_s']} GFLOP/s; ceiling against lerobot fp32 "
          f"{out['ceiling_vs_lerobot_fp32']}x (roboloop now {out['roboloop_vs_lerobot_fp32']}x)")
    emit(out, MEASURES)


if __name__ == "__main__":
    main()
