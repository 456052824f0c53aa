"""Data-parallel training under torchrun (single node or multi-node rendezvous).

Every rank walks the same seeded key stream and forms the same *global* pack; rank r
materialises samples r, r+W, r+2W, ... of it, so the global batch does not depend on the
number of ranks, and with the loss divided by the global count of valid steps DDP's
gradient average equals the single-process gradient. Only the samples a rank trains on are
decoded. With `accumulate` N a pack has W x N slots: rank r's micro-batch j trains on slot j*W + r, so one rank
with N micro-batches and N ranks with one each train on the same samples and make the same update.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init(device_pref: str = "auto") -> DistEnv:
    """Join the process group torchrun set up (WORLD_SIZE > 1), or run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device_pref == "auto" else device_pref.startswith("cuda")
    device = torch.device(f"cuda:{local}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        # the launcher's collective_timeout_s: a rank waiting for a lost node fails then (torch's default: 10 min for
        # NCCL, 30 for gloo), so the run fails or restarts in a time the team chose
        from datetime import timedelta

        timeout = timedelta(seconds=float(os.environ.get("ROBOLOOP_COLLECTIVE_TIMEOUT_S", "600")))
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timeout)
    return DistEnv(rank, world, local, device)


def wrap(model: nn.Module, env: DistEnv, strategy: str = "ddp", idle_params: bool = False,
         grad_reduce: str = "fp32") -> nn.Module:
    """DDP: replicate and all-reduce gradients. FSDP2 (`fully_shard`): shard parameters, gradients
    and optimizer state over the ranks, one unit per transformer block (or per `model.fsdp_units()`, children
    before their parents) plus the root. Both
    average gradients over ranks, so the loss scaling is the same. FSDP shards `model` in
    place and returns it; DDP returns a wrapper whose `forward` must be called."""
    if env.world_size == 1:
        return model
    if strategy in ("fsdp", "hsdp"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # grad_reduce bf16: gradients reduce-scattered in bf16; parameters (and so the optimizer's shards) stay fp32
        mp = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16 if grad_reduce == "bf16" else None)
        mesh = hsdp_mesh(env) if strategy == "hsdp" else None
        units = getattr(model, "fsdp_units", None)
        for block in units() if units else [*getattr(model, "blocks", []), *getattr(model, "head_blocks", [])]:
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    # `idle_params`: some parameters get no gradient in any step (a VLA trained without its cameras: its image path),
    # which DDP's reducer refuses unless told to look for them after each forward (found training the demo's recipe,
    # state and language only, on two nodes: "Expected to have finished reduction in the prior iteration")
    ddp = DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
              find_unused_parameters=idle_params)
    if grad_reduce == "bf16":  # each bucket cast to bf16, all-reduced, cast back into the fp32 gradients
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(dist.group.WORLD, default_hooks.bf16_compress_hook)
    return ddp


@contextlib.contextmanager
def gradient_sync(wrapped: nn.Module, env: DistEnv, sync: bool) -> Iterator[None]:
    """Backward passes inside synchronise gradients across ranks only if `sync` (the last micro-batch of an
    accumulation window): DDP's `no_sync`, FSDP2's `set_requires_gradient_sync` (its reduce-scatter skipped, the
    unsharded gradients kept until the last). One rank: nothing to synchronise."""
    if env.world_size == 1 or sync and not hasattr(wrapped, "set_requires_gradient_sync"):
        yield
        return
    if hasattr(wrapped, "set_requires_gradient_sync"):  # FSDP2
        wrapped.set_requires_gradient_sync(sync)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)
        return
    with wrapped.no_sync():  # type: ignore[operator]
        yield


def full_state_dict(model: nn.Module, sharded: bool) -> dict[str, torch.Tensor]:
    """The whole model's weights on CPU (a collective under FSDP: every rank must call it); a module's extra
    state (a training counter, not a weight) is left out."""
    if not sharded:
        return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.contiguous() for k, v in sd.items()}


def hsdp_mesh(env: DistEnv):
    """HSDP's 2-D mesh: replicate across the nodes, shard across each node's ranks (torchrun's LOCAL_WORLD_SIZE)."""
    from torch.distributed.device_mesh import init_device_mesh

    n = nodes(env)
    return init_device_mesh(env.device.type, (n, env.world_size // n), mesh_dim_names=("replicate", "shard"))


def nodes(env: DistEnv) -> int:
    """How many machines the ranks run on (torchrun's LOCAL_WORLD_SIZE ranks on each)."""
    return max(1, env.world_size // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size))))


def all_gather_json(obj: Any, env: DistEnv) -> list[Any]:
    """Every rank's `obj` (JSON: what a peer sends is read as data, never unpickled), in rank order."""
    if env.world_size == 1:
        return [obj]
    data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8).to(env.device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=env.device) for _ in range(env.world_size)]
    dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64, device=env.device))
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros(longest, dtype=torch.uint8, device=env.device)
    padded[: data.numel()] = data
    out = [torch.empty(longest, dtype=torch.uint8, device=env.device) for _ in range(env.world_size)]
    dist.all_gather(out, padded)
    return [json.loads(bytes(t[: int(s.item())].cpu().tolist())) for t, s in zip(out, sizes, strict=True)]


def all_reduce_sum(x: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.world_size > 1:
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def barrier(env: DistEnv) -> None:
    if env.world_size > 1:
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def torchrun_command(config_json: str, nproc_per_node: int, nnodes: int = 1, node_rank: int = 0,
                     rdzv_endpoint: str = "127.0.0.1:29500", max_restarts: int = 0,
                     run_id: str = "roboloop", join_timeout_s: float = 600) -> list[str]:
    """The torchrun command line that trains `config_json` (a TrainConfig file) on this node.

    Multi-node: every node runs it with the same rdzv endpoint and run id (c10d rendezvous).
    `max_restarts` lets torchrun restart failed ranks; they resume from the last checkpoint.
    """
    torchrun = shutil.which("torchrun") or sys.executable + " -m torch.distributed.run"
    return [*torchrun.split(), f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
            f"--node-rank={node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
            f"--rdzv-id={run_id}", f"--max-restarts={max_restarts}", f"--rdzv-conf=join_timeout={int(join_timeout_s)}",
            "-m", "roboloop.entry", "train", config_json]  # ranks never re-read launch settings
