"""FP8 weights gathered in FP8 under FSDP2 (roboloop.training.precision `fp8_all_gather`, torchao's
enable_fsdp_float8_all_gather): on two gloo ranks on CPU (torchao's emulated casts) the gathers carry float8 and the
losses equal those of gathering fp32 weights and casting after; when it is off, why is said. The GPU test runs the
trainer with real FP8 GEMMs under one-rank FSDP2."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from roboloop import availability
from roboloop.training import precision
from roboloop.training.precision import PrecisionPlan


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, all_gather: bool, out: dict) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torchao.float8 import fsdp_utils

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo")
    gathered: list[str] = []
    original = fsdp_utils.WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather

    def seen(self, mesh):  # what FSDP2 sends for an FP8 weight (torchao's hook; its signature checked by FSDP2)
        sent = original(self, mesh)
        gathered.append(str(sent[0][0].dtype))
        return sent

    fsdp_utils.WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather = seen
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    n = precision.apply_fp8(model, PrecisionPlan("fp8", "test", "torchao"), min_features=64, emulate=True,
                            all_gather=all_gather)
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), 1e-2)
    x, losses = torch.randn(32, 64, generator=torch.Generator().manual_seed(rank)), []
    for _ in range(4):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if all_gather:
            precision.after_optimizer_step(model)
        losses.append(loss.item())
    out[rank] = {"converted": n, "gathered": sorted(set(gathered)), "losses": losses}
    dist.destroy_process_group()


def _spawn(all_gather: bool) -> dict:
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(_port(), all_gather, out), nprocs=2)
    return dict(out)


@pytest.mark.slow
def test_fsdp2_gathers_the_fp8_weights_in_fp8_with_the_same_losses():
    on, off = _spawn(True), _spawn(False)
    assert on[0]["converted"] == 2 and on[0]["gathered"] == ["torch.float8_e4m3fn"], on
    assert off[0]["gathered"] == [], off  # fp32 weights gathered, then cast
    for rank in (0, 1):  # one scale per weight either way: the same FP8 values
        assert on[rank]["losses"] == pytest.approx(off[rank]["losses"], rel=1e-5), (on, off)
    assert on[0]["losses"][-1] < on[0]["losses"][0]


def test_when_the_weights_are_not_gathered_in_fp8_the_run_record_says_why():
    fp8 = PrecisionPlan("fp8", "test", "torchao")
    assert precision.fp8_all_gather(fp8, True, "tensorwise")[0] is True
    assert precision.fp8_all_gather(fp8, False, "tensorwise") == (False, "off: no FSDP2 (the weights are not gathered)")
    assert "tensorwise scaling only" in precision.fp8_all_gather(fp8, True, "rowwise")[1]
    assert "te has no FP8 all-gather" in precision.fp8_all_gather(PrecisionPlan("fp8", "t", "te"), True,
                                                                   "tensorwise")[1]
    assert precision.fp8_all_gather(PrecisionPlan("bf16", "t"), True, "tensorwise") == (False, "off: not an FP8 run")


@pytest.mark.gpu
def test_the_trainer_gathers_fp8_weights_under_fsdp2_on_the_gpu(tiny_v3, tmp_path, monkeypatch):
    """`strategy fsdp` on one CUDA rank (FSDP2 still gathers) with real FP8 GEMMs: the run record says the gather is
    on and the loss falls."""
    import json

    from roboloop.training.config import TrainConfig
    from roboloop.training.train import train

    if not availability.fp8_hardware():
        pytest.skip("needs compute capability >= 8.9")
    monkeypatch.setattr(precision, "FP8_MIN_FEATURES", 64)
    cfg = TrainConfig(dataset=str(tiny_v3), output_dir=str(tmp_path / "out"), steps=20, lr=2e-3, warmup_steps=3,
                      num_workers=1, max_tokens=256, model_overrides={"image_size": [32, 32], "horizon": 8},
                      device="cuda", precision="fp8", strategy="fsdp", checkpoint_every_steps=0)
    train(cfg)
    rows = [json.loads(r) for r in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["run"]["fp8_all_gather"].startswith("on:"), rows[0]["run"]
    assert rows[-1]["loss"] < rows[0]["loss"]
