"""`roboloop plan`: size a fine-tune before it runs. The family's real configuration is built on the meta device
(roboloop/policies/foundation.py), measured (roboloop/training/plan.py) and printed as a table and one JSON line;
exit 2 with one line saying why where a micro-batch of one sample does not fit."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from roboloop.cli.common import Options, jsonline

DEFAULT_MICRO = 32  # samples per GPU projected when --micro-batch is not given (fewer where fewer fit)


def add_parsers(sub, options: Options) -> None:
    p = sub.add_parser("plan", help="size a fine-tune before it runs: parameters, bytes per GPU, the largest "
                       "micro-batch that fits, projected tokens/s (no weights, no GPU)")
    p.add_argument("--policy-type", required=True, help="pi05 or pi0 (LeRobot's implementation)")
    p.add_argument("--pretrained", type=Path, help="a local LeRobot policy folder: its config.json decides the "
                   "variants, cameras, state and action sizes (nothing is downloaded)")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--gpu-memory-gb", type=float, default=80.0)
    p.add_argument("--strategy", choices=["ddp", "fsdp", "hsdp"], default="fsdp")
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--precision", choices=["bf16", "fp8", "fp32"], default="bf16")
    p.add_argument("--grad-reduce", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--finetune", choices=["full", "lora", "frozen_backbone"], default="full")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-targets", help="a regex of whole module names LoRA adapts (default: the policy's own, "
                   "those LeRobot gives lerobot-train --peft)")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--cameras", type=int, default=2, help="without --pretrained: images per sample")
    p.add_argument("--state-dim", type=int, default=6)
    p.add_argument("--action-dim", type=int, default=6)
    p.add_argument("--micro-batch", type=int, help="samples per GPU per micro-batch to project (default: the "
                   "largest that fits, at most 32)")
    p.add_argument("--frames", type=int, help="samples in an epoch (default: --dataset's frames)")
    p.add_argument("--dataset", type=Path, help="a LeRobot dataset folder: its meta/info.json's total_frames")
    p.add_argument("--peak-tflops", type=float, help="the GPU's dense peak (default H100 SXM: 989 bf16, 494 tf32)")
    p.set_defaults(fn=cmd_plan)


def make_plan(args: argparse.Namespace) -> dict:
    """The plan's figures (see roboloop/training/plan.py for what is measured and what is assumed)."""
    from roboloop.policies import foundation
    from roboloop.training import plan

    built = foundation.build(args.policy_type, args.pretrained, args.cameras, args.state_dim, args.action_dim,
                             args.precision, args.activation_checkpointing)
    counts = foundation.freeze(built, args.finetune, args.lora_rank, args.lora_targets)
    sample = plan.per_sample(built.loss, counts["trainable"] > 0)
    mem = plan.memory(counts, plan.largest_block(built.policy), sample["activation_bytes"], args.gpus,
                      args.gpu_memory_gb, args.strategy, args.precision, args.gpus_per_node)
    micro = args.micro_batch or min(mem["max_micro_batch"], DEFAULT_MICRO)
    frames = args.frames or _frames(args.dataset)
    reason = plan.verdict(mem, args.gpus, args.gpu_memory_gb)
    if args.micro_batch and args.micro_batch > mem["max_micro_batch"] and not reason:
        reason = f"does not fit: --micro-batch {args.micro_batch} > {mem['max_micro_batch']}, the largest that fits"
    tput = plan.throughput(counts, sample["flops"], built.tokens_per_sample, micro, args.gpus, args.strategy,
                           args.accumulate, args.precision, args.grad_reduce, frames, args.peak_tflops) if micro else {}
    settings = {k: getattr(args, k) for k in ("policy_type", "gpus", "gpus_per_node", "gpu_memory_gb", "strategy",
                                              "accumulate", "precision", "grad_reduce", "finetune", "lora_rank",
                                              "lora_targets", "activation_checkpointing")}
    return {"settings": {**settings, "pretrained": str(args.pretrained) if args.pretrained else None},
            "counts": counts, "tokens_per_sample": built.tokens_per_sample, "flops_per_sample": sample["flops"],
            "memory": mem, "micro_batch": micro, "throughput": tput, "fits": reason is None, "reason": reason}


def _frames(dataset: Path | None) -> int | None:
    if dataset is None:
        return None
    info = dataset / "meta" / "info.json"
    if not info.is_file():
        raise FileNotFoundError(f"--dataset {dataset}: no meta/info.json (a LeRobot dataset folder)")
    return int(json.loads(info.read_text())["total_frames"])


def cmd_plan(args: argparse.Namespace) -> int:
    from roboloop.training.plan import table

    result = make_plan(args)
    print(table(result), file=sys.stderr)
    print(jsonline(result))
    if not result["fits"]:
        print(f"roboloop plan: {result['reason']}", file=sys.stderr)
        return 2
    return 0
