"""The scale model: the time of one optimizer step on p GPUs, compute plus the communication that does not hide
under it, for DDP, FSDP2 and HSDP (`bench/scale.py` prints it from 8 to 1,024 GPUs and checks its byte counts
against the wire; `roboloop plan` projects a policy's tokens per second with it).

Assumptions (`network()`'s arguments; bench/scale.py's docstring gives their sources): 8 GPUs per node on NVLink 4
(450 GB/s one way per GPU), one 400 Gb/s NIC per GPU between nodes, 0.9 of a link's rate reached; 2 us per
collective step on NVLink, 6 us across nodes; H100 SXM dense BF16 peak 989 TFLOP/s at 0.35 MFU."""

from __future__ import annotations

import math

PER_NODE = 8
H100_BF16_TFLOPS = 989.0
MFU = 0.35


def network(ib_gbps: float = 400.0, nvlink_gbytes: float = 450.0, link_efficiency: float = 0.9) -> dict:
    """Bandwidths (bytes/s) and per-step latencies (s) of the links, as `project` reads them."""
    return {"ib_Bps": ib_gbps / 8 * 1e9 * link_efficiency, "ib_alpha_s": 6e-6,
            "nvlink_Bps": nvlink_gbytes * 1e9 * link_efficiency, "nvlink_alpha_s": 2e-6}


def allreduce_s(size: float, p: int, bw: float, alpha: float) -> float:
    if p <= 1:
        return 0.0
    ring = 2 * (p - 1) * alpha + 2 * (p - 1) / p * size / bw
    tree = 2 * math.log2(p) * alpha + 2 * size / bw
    return min(ring, tree)


def gather_s(size: float, p: int, bw: float, alpha: float) -> float:
    """All-gather (or reduce-scatter) of a `size`-byte whole: ring, (p-1) steps of size/p."""
    return 0.0 if p <= 1 else (p - 1) * alpha + (p - 1) / p * size / bw


def project(facts: dict, step_s: float, p: int, net: dict, accumulate: int = 1, grad_bytes: float | None = None
            ) -> dict:
    """One optimizer step on `p` GPUs: `accumulate` micro-batches of `step_s` compute each, gradients synchronised
    once, overlapped with the last micro-batch's backward pass (`train.accumulate`: DDP's no_sync, FSDP2's
    set_requires_gradient_sync); `grad_bytes` (default the facts'): what a gradient synchronisation moves
    (`train.grad_reduce` bf16 halves it). FSDP2 gathers the fp32 parameters in every micro-batch."""
    intra = p <= PER_NODE
    bw = net["nvlink_Bps"] if intra else net["ib_Bps"]
    alpha = net["nvlink_alpha_s"] if intra else net["ib_alpha_s"]
    s = facts["grad_bytes"] if grad_bytes is None else grad_bytes
    fwd, bwd = step_s / 3, 2 * step_s / 3
    compute = accumulate * step_s
    ddp_comm = allreduce_s(s, p, bw, alpha)
    ddp_exposed = max(0.0, ddp_comm - bwd) + allreduce_s(min(s, 25e6), p, bw, alpha)
    ag, rs = gather_s(4 * facts["params"], p, bw, alpha), gather_s(s, p, bw, alpha)
    fsdp_exposed = accumulate * max(0.0, ag - fwd) + (accumulate - 1) * max(0.0, ag - bwd) + max(0.0, ag + rs - bwd)
    nodes = max(1, p // PER_NODE)
    hsdp_exposed = _hsdp_exposed(facts, s, p, net, accumulate, fwd, bwd) if nodes > 1 else fsdp_exposed
    ddp_step = compute + ddp_exposed
    return {"gpus": p, "nodes": nodes,
            "hsdp": {"step_ms": round((compute + hsdp_exposed) * 1e3, 1),
                     "efficiency": round(compute / (compute + hsdp_exposed), 3)},
            "ddp": {"step_ms": round(ddp_step * 1e3, 1), "allreduce_ms": round(ddp_comm * 1e3, 1),
                    "efficiency": round(compute / ddp_step, 3)},
            "fsdp2": {"step_ms": round((compute + fsdp_exposed) * 1e3, 1), "gather_ms": round(ag * 1e3, 1),
                      "efficiency": round(compute / (compute + fsdp_exposed), 3)},
            "node_samples_per_s": round(PER_NODE * accumulate * facts["samples_per_gpu_step"] / ddp_step, 1),
            "node_frames_per_s": round(2 * PER_NODE * accumulate * facts["samples_per_gpu_step"] / ddp_step, 1)}


def _hsdp_exposed(facts: dict, s: float, p: int, net: dict, accumulate: int, fwd: float, bwd: float) -> float:
    """HSDP (`train.strategy hsdp`): the parameters sharded over a node's 8 GPUs (gathered and gradients
    reduce-scattered on NVLink, in every micro-batch as FSDP2), replicated across nodes: each GPU all-reduces its
    node's shard of the gradients (1/8 of them) with the same shard's GPUs of the other nodes, on its own NIC; the
    last 25 MB bucket's reduction is not overlapped.

    The DDP and FSDP2 columns price every byte of a collective over all p GPUs at one NIC's rate (a flat ring: the
    conservative bound). NCCL's rings and trees on a rail-optimised cluster (a channel per NIC) move about 1/8 of a
    DDP all-reduce's bytes across nodes, as HSDP does; HSDP's 2-D mesh guarantees it whatever NCCL chooses, so a
    real DDP run lands between the two columns."""
    nodes = p // PER_NODE
    ag = gather_s(4 * facts["params"], PER_NODE, net["nvlink_Bps"], net["nvlink_alpha_s"])
    rs = gather_s(s, PER_NODE, net["nvlink_Bps"], net["nvlink_alpha_s"])
    across = allreduce_s(s / PER_NODE, nodes, net["ib_Bps"], net["ib_alpha_s"])
    last = gather_s(min(s, 25e6), PER_NODE, net["nvlink_Bps"], net["nvlink_alpha_s"]) + \
        allreduce_s(min(s, 25e6) / PER_NODE, nodes, net["ib_Bps"], net["ib_alpha_s"])  # after the backward pass
    return accumulate * max(0.0, ag - fwd) + (accumulate - 1) * max(0.0, ag - bwd) + \
        max(0.0, ag + rs + across - bwd) + last
