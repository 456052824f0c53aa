"""Sizing a training run before it runs (`roboloop plan`): what each GPU holds, the largest per-GPU micro-batch
that fits, and the throughput the scale model projects (roboloop/training/scalemodel.py).

Measured on the meta device, from the model itself (no weights, no GPU): its parameters and which are trained;
the activations one sample keeps for the backward pass (the bytes of the tensors autograd saves, counted once
each, at two batch sizes: the difference is one sample's, the weights autograd also saves fall out); the FLOPs of
one sample's forward and backward pass (torch's FLOP counter, the same two batch sizes).

Assumed, as roboloop's engine trains (every figure is in the result): trained parameters kept as fp32 masters
with fp32 gradients and AdamW's two fp32 moments; frozen ones in the compute dtype (bf16, or fp32 under
`precision fp32`); FSDP2 shards all of it over the GPUs, HSDP over a node's, DDP not at all, and FSDP2/HSDP hold
two gathered blocks at a time in the compute dtype; a reserve of 8% of the GPU's memory plus 2 GiB for the CUDA
context, communication buffers and the allocator's fragmentation; the GPU's dense peak (H100 SXM: 989 TFLOP/s
BF16, 494 TF32) at 0.35 MFU. FP8 is planned as bf16: roboloop's measured FP8 grid decides where it pays."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from roboloop.training.scalemodel import H100_BF16_TFLOPS, MFU, PER_NODE, network, project

GIB = 2**30
STRATEGIES = ("ddp", "fsdp", "hsdp")
CHECKPOINT_KWARGS = ("use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug")


def saved_bytes(loss: Callable[[int], torch.Tensor], b: int) -> int:
    """Bytes of the distinct tensors autograd keeps for the backward pass of a loss of `b` samples. Under
    activation checkpointing (torch.utils.checkpoint) a checkpointed block keeps its inputs, and the backward pass
    recomputes one block at a time: its inputs are counted for every block, what it saves besides them once, for
    the largest block. A tensor saved twice (a layer's output that the next layer saves as its input) counts once."""
    outer: dict[int, int] = {}
    inner: list[int] = [0]
    keep: list[torch.Tensor] = []

    def counter(into: dict[int, int]):
        def pack(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in into and id(t) not in outer:
                into[id(t)] = t.numel() * t.element_size()
                keep.append(t)  # alive until counted: an id is not reused meanwhile
            return t
        return pack

    def checkpointed(fn, *args, **kwargs):
        for a in args:
            if isinstance(a, torch.Tensor):
                counter(outer)(a)
        block: dict[int, int] = {}
        with torch.autograd.graph.saved_tensors_hooks(counter(block), lambda t: t):
            out = fn(*args, **{k: v for k, v in kwargs.items() if k not in CHECKPOINT_KWARGS})
        inner[0] = max(inner[0], sum(block.values()))
        return out

    real = torch.utils.checkpoint.checkpoint
    torch.utils.checkpoint.checkpoint = checkpointed
    try:
        with torch.autograd.graph.saved_tensors_hooks(counter(outer), lambda t: t):
            loss(b)
    finally:
        torch.utils.checkpoint.checkpoint = real
    return sum(outer.values()) + inner[0]


def train_flops(loss: Callable[[int], torch.Tensor], b: int, trains: bool) -> int:
    """FLOPs of a forward and backward pass of `b` samples (only the forward where nothing is trained)."""
    with FlopCounterMode(display=False) as counter:
        out = loss(b)
        if trains:
            out.float().sum().backward()
    return counter.get_total_flops()


def per_sample(loss: Callable[[int], torch.Tensor], trains: bool) -> dict:
    """One sample's activations (bytes) and training FLOPs: the difference between 2 samples and 1."""
    acts = saved_bytes(loss, 2) - saved_bytes(loss, 1)
    flops = train_flops(loss, 2, trains) - train_flops(loss, 1, trains)
    return {"activation_bytes": acts, "flops": flops}


def largest_block(model: nn.Module) -> int:
    """Parameters of the largest transformer block (a child of a ModuleList): what FSDP2 gathers at once."""
    sizes = [sum(p.numel() for p in m.parameters()) for lst in model.modules() if isinstance(lst, nn.ModuleList)
             for m in lst]
    return max(sizes, default=0)


def shards(strategy: str, gpus: int, per_node: int) -> int:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    return {"ddp": 1, "fsdp": gpus, "hsdp": min(gpus, per_node)}[strategy]


def memory(counts: dict, block: int, act_per_sample: int, gpus: int, gpu_memory_gb: float, strategy: str,
           precision: str, per_node: int = PER_NODE) -> dict:
    """Bytes per GPU of weights, gradients, optimizer state and gathered blocks; the reserve; what is left for
    activations and so the largest per-GPU micro-batch."""
    n = shards(strategy, gpus, per_node)
    compute = 4 if precision == "fp32" else 2
    weights = (4 * counts["trainable"] + compute * counts["frozen"]) / n
    grads, optim = 4 * counts["trainable"] / n, 8 * counts["trainable"] / n
    gathered = 2 * compute * block if strategy != "ddp" and n > 1 else 0
    total = gpu_memory_gb * 1e9
    reserve = 0.08 * total + 2 * GIB
    free = total - reserve - weights - grads - optim - gathered
    micro = max(0, math.floor(free / act_per_sample)) if act_per_sample > 0 else 0
    return {"weights": int(weights), "gradients": int(grads), "optimizer": int(optim), "gathered_blocks": int(gathered),
            "reserve": int(reserve), "activations_per_sample": int(act_per_sample),
            "left_for_activations": int(free), "max_micro_batch": micro, "shards": n}


def throughput(counts: dict, flops_per_sample: int, tokens_per_sample: int, micro: int, gpus: int, strategy: str,
               accumulate: int, precision: str, grad_reduce: str, frames: int | None,
               peak_tflops: float | None = None, mfu: float = MFU) -> dict:
    """The scale model's projection at `micro` samples per GPU per micro-batch: step time, efficiency, samples
    and tokens per second over all GPUs, minutes per epoch of `frames` samples."""
    peak = (peak_tflops or (H100_BF16_TFLOPS / 2 if precision == "fp32" else H100_BF16_TFLOPS)) * 1e12
    step_s = micro * flops_per_sample / (peak * mfu)
    facts = {"params": counts["params"], "grad_bytes": counts["trainable"] * (2 if grad_reduce == "bf16" else 4),
             "samples_per_gpu_step": micro}
    row = project(facts, step_s, gpus, network(), accumulate)
    col = {"ddp": "ddp", "fsdp": "fsdp2", "hsdp": "hsdp"}[strategy]
    step_ms, eff = row[col]["step_ms"], row[col]["efficiency"]
    samples_s = gpus * accumulate * micro / (step_ms / 1e3) if step_ms else 0.0
    return {"step_ms": step_ms, "efficiency": eff, "samples_per_s": round(samples_s, 1),
            "tokens_per_s": round(samples_s * tokens_per_sample), "peak_tflops": peak / 1e12, "mfu": mfu,
            "minutes_per_epoch": round(frames / samples_s / 60, 2) if frames and samples_s else None}


def verdict(mem: dict, gpus: int, gpu_memory_gb: float) -> str | None:
    """None where a micro-batch of one sample fits; otherwise the line that says what does not fit and why."""
    if mem["max_micro_batch"] >= 1:
        return None
    labels = {"weights": "the weights take", "gradients": "the gradients take", "optimizer": "the optimizer state "
              "takes", "gathered_blocks": "FSDP's gathered blocks take", "reserve": "the reserve takes"}
    biggest = max(labels, key=lambda k: mem[k])
    return (f"does not fit: one sample needs {mem['activations_per_sample'] / 1e9:.1f} GB of activations and "
            f"{max(0, mem['left_for_activations']) / 1e9:.1f} GB are left of {gpu_memory_gb:g} GB per GPU on {gpus} "
            f"GPU(s) ({labels[biggest]} {mem[biggest] / 1e9:.1f} GB): shard it (--strategy fsdp or hsdp), add GPUs, "
            "fine-tune less of it (--finetune lora or frozen_backbone) or --activation-checkpointing")


def table(result: dict) -> str:
    """The plan as a person reads it."""
    m, c, t = result["memory"], result["counts"], result["throughput"]
    rows = [("parameters", f"{c['params'] / 1e9:.3f} B"), ("trainable", f"{c['trainable'] / 1e6:,.1f} M"),
            ("weights per GPU", _gb(m["weights"])), ("gradients per GPU", _gb(m["gradients"])),
            ("optimizer per GPU", _gb(m["optimizer"])), ("gathered blocks", _gb(m["gathered_blocks"])),
            ("reserve", _gb(m["reserve"])), ("activations per sample", _gb(m["activations_per_sample"])),
            ("largest micro-batch per GPU", str(m["max_micro_batch"])),
            ("tokens per sample", str(result["tokens_per_sample"])),
            ("TFLOP per sample (fwd+bwd)", f"{result['flops_per_sample'] / 1e12:.2f}")]
    if t:
        rows += [("step (ms) / efficiency", f"{t['step_ms']} / {t['efficiency']:.1%}"),
                 ("samples/s, tokens/s", f"{t['samples_per_s']:,} / {t['tokens_per_s']:,}"),
                 ("minutes per epoch", str(t["minutes_per_epoch"]))]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    return "\n".join([*lines, "fits" if result["fits"] else result["reason"]])


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"
