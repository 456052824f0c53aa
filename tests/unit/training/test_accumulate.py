"""Gradient accumulation: N micro-batches on one rank make the update one pack of N times the tokens makes (the same
samples, the loss normalised by the whole step's action steps), and a run that accumulates resumes exactly.
Activation checkpointing recomputes the blocks' activations and changes nothing else: the same losses and weights."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from roboloop.training.config import TrainConfig
from roboloop.training.train import train


def _run(v3, out, **kw):
    kw = {"checkpoint_every_steps": 0, **kw}
    cfg = TrainConfig(dataset=str(v3), output_dir=str(out), steps=12, lr=2e-3, warmup_steps=3, num_workers=1,
                      device="cpu", max_samples=1024, model_overrides={"image_size": [32, 32], "horizon": 8}, **kw)
    train(cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows, load_file(out / "model.safetensors")


def test_four_micro_batches_make_the_update_of_one_pack_four_times_larger(tiny_v3, tmp_path):
    one, w_one = _run(tiny_v3, tmp_path / "one", max_tokens=1024)
    four, w_four = _run(tiny_v3, tmp_path / "four", max_tokens=256, accumulate=4)
    assert [r["step"] for r in four] == list(range(1, 13))  # optimizer steps, not micro-batches
    assert [r["lr"] for r in four] == [r["lr"] for r in one]  # the schedule counts optimizer steps
    for a, b in zip(one, four, strict=True):
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (a["step"], a["loss"], b["loss"])
        assert a["samples_per_s"] > 0 and b["nonpad_fraction"] > 0
    # the weights: within 1e-5 but where a gradient is at the roundoff's scale, which AdamW's normalised step turns
    # into a visible one (measured on a 4-episode dataset: 166 of 772,902 elements after 12 steps, the largest
    # 1.1e-4, a 20th of the lr)
    diff = torch.cat([(w_one[k] - w_four[k]).abs().flatten() for k in w_one])
    assert (diff > 1e-5).float().mean().item() <= 1e-3 and diff.max().item() <= 2e-3 / 10
    # activation checkpointing: the blocks recomputed in the backward pass, the same run bit for bit
    ac, w_ac = _run(tiny_v3, tmp_path / "ac", max_tokens=1024, activation_checkpointing=True)
    assert ac[0]["run"]["activation_checkpointing"]["blocks"] > 0
    assert [r["loss"] for r in ac] == [r["loss"] for r in one] and all(torch.equal(w_one[k], w_ac[k]) for k in w_one)
    # and it is not the same as not accumulating: one micro-batch of 256 tokens per step trains on other samples
    small, _ = _run(tiny_v3, tmp_path / "small", max_tokens=256)
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(one[1:], small[1:], strict=True)) > 1e-3


def test_an_accumulating_run_resumes_exactly_and_refuses_another_window(tiny_v3, tmp_path):
    ref, w_ref = _run(tiny_v3, tmp_path / "ref", max_tokens=256, accumulate=3)
    out = tmp_path / "cut"
    _run(tiny_v3, out, max_tokens=256, accumulate=3, checkpoint_every_steps=5)
    (out / "model.safetensors").unlink()  # as if killed after its last checkpoint (step 10)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= 10))
    again, w_again = _run(tiny_v3, out, max_tokens=256, accumulate=3, checkpoint_every_steps=5)
    assert [r["loss"] for r in again] == [r["loss"] for r in ref]
    assert all(torch.equal(w_ref[k], w_again[k]) for k in w_ref)
    (out / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="written by a run of 3 data slots per step .* resume with accumulate 3"):
        _run(tiny_v3, out, max_tokens=256, accumulate=2, checkpoint_every_steps=5)
