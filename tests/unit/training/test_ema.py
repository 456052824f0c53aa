"""The weight average (`ema_decay`): the arithmetic, that it never changes training, that the final model and
the checkpoint exports hold it, and that a resumed run continues it exactly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from roboloop.training import checkpoint
from roboloop.training.config import TrainConfig
from roboloop.training.ema import WeightAverage
from roboloop.training.kept import export_checkpoint
from roboloop.training.train import train


def test_the_average_is_the_warmed_up_exponential_average():
    lin = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(0.0)
    avg = WeightAverage(lin, 0.9)
    want = torch.zeros(1, 2)
    for n, value in enumerate([1.0, 2.0, 4.0, -1.0, 3.0, 0.5]):
        with torch.no_grad():
            lin.weight.fill_(value)
        d = min(0.9, (1 + n) / (10 + n))
        want = d * want + (1 - d) * value
        avg.update()
    assert torch.allclose(avg.shadow["weight"], want)
    assert avg.updates == 6 and lin.weight.flatten().tolist() == [0.5, 0.5]  # the model itself is untouched
    with pytest.raises(ValueError, match="ema_decay"):
        WeightAverage(lin, 1.0)


def _cfg(ds, out, **kw) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), max_tokens=1024, lr=2e-3, warmup_steps=2, steps=12,
                lr_schedule="constant",  # the resumed run first stops at step 7: the same rate either way
                checkpoint_every_steps=0, model_overrides={"image_size": [32, 32], "horizon": 8})
    return TrainConfig(**{**base, **kw})


def _losses(out) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_final_model_and_checkpoint_exports_hold_the_average_and_resume_continues_it(tiny_v3, tmp_path):
    plain, avg, resumed = tmp_path / "plain", tmp_path / "avg", tmp_path / "resumed"
    train(_cfg(tiny_v3, plain))
    train(_cfg(tiny_v3, avg, ema_decay=0.8, checkpoint_every_steps=6))
    assert _losses(plain) == _losses(avg)  # the average never feeds back into training
    w_plain, w_avg = load_file(plain / "model.safetensors"), load_file(avg / "model.safetensors")
    assert w_plain.keys() == w_avg.keys()
    assert any(not torch.equal(w_plain[k], w_avg[k]) for k in w_plain)
    # the checkpoint after step 6 carries the average; its export (what checkpoint-sweep evaluates) holds it
    ckpt = checkpoint.latest(avg / "checkpoints")
    state = checkpoint.load(ckpt)
    assert state["ema"]["updates"] == 6
    exported = load_file(export_checkpoint(avg, ckpt, 6, tmp_path / "step6") / "model.safetensors")
    shadow = state["ema"]["shadow"]
    assert all(torch.equal(exported[k], shadow[k].to(exported[k].dtype)) for k in shadow)
    assert any(not torch.equal(exported[k], state["model"][k]) for k in shadow)
    # a run stopped after that checkpoint and resumed ends with the uninterrupted run's average, bit for bit
    train(_cfg(tiny_v3, resumed, ema_decay=0.8, checkpoint_every_steps=6, steps=7))
    (resumed / "model.safetensors").unlink()
    train(_cfg(tiny_v3, resumed, ema_decay=0.8, checkpoint_every_steps=6))
    w_resumed = load_file(resumed / "model.safetensors")
    assert all(torch.equal(w_resumed[k], w_avg[k]) for k in w_avg)
