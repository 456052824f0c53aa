"""Gradient traffic in bf16, on two gloo ranks in this machine: what DDP's hook and FSDP2's reduce dtype put on the
wire is bf16 (the reduced gradient is the fp32 one rounded, not the fp32 one), the weights stay fp32, and accumulating
micro-batches without synchronising gives the gradient of one synchronised pass over them all."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from roboloop.training.distributed import DistEnv, gradient_sync, wrap


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(2)])

    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x))
        return x.pow(2).sum()


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[n.replace("module.", "")] = g.detach().clone()
    return out


def _rank(rank: int, port: int, strategy: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    env = DistEnv(rank, 2, rank, torch.device("cpu"))
    torch.manual_seed(100 + rank)
    xs = [torch.randn(8, 64) * 3 for _ in range(3)]  # three micro-batches per rank, different on each rank
    got = {}
    for reduce in ("fp32", "bf16"):
        model = wrap(Blocks(), env, strategy, grad_reduce=reduce)
        for i, x in enumerate(xs):
            with gradient_sync(model, env, i == len(xs) - 1):
                model(x).backward()
        got[reduce] = _grads(model)
        got[reduce + "_dtype"] = str(next(model.parameters()).dtype)
    ref = Blocks()  # one pass, no traffic: the mean over both ranks' six micro-batches of the summed loss
    all_x = [None, None]
    dist.all_gather_object(all_x, xs)
    for x in (x for rank_xs in all_x for x in rank_xs):
        (ref(x) / 2).backward()
    got["ref"] = {n: p.grad.clone() for n, p in ref.named_parameters()}
    if rank == 0:
        results.update({k: v for k, v in got.items()})
    dist.destroy_process_group()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_gradients_travel_in_bf16_and_accumulate_without_sync(strategy):
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(_port(), strategy, results), nprocs=2, join=True)
    ref, fp32, bf16 = results["ref"], results["fp32"], results["bf16"]
    for n, g in ref.items():
        scale = g.abs().max().item()
        assert (fp32[n] - g).abs().max().item() <= 1e-5 * scale, n  # accumulation without sync: exact
        err = (bf16[n] - g).abs().max().item()
        assert 0 < err <= 2 ** -7 * scale, (n, err, scale)  # rounded as bf16 rounds (8 bits): sent in bf16
    assert results["bf16_dtype"] == results["fp32_dtype"] == "torch.float32"  # the weights stay fp32
