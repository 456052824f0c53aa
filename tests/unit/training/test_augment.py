"""Random-shift augmentation (`image_shift`): the gather, the draws, that training sees shifted pictures, that
a resumed run continues exactly, and what it refuses."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from roboloop.training.augment import shift_images, shifts
from roboloop.training.config import TrainConfig, TrainRecipe
from roboloop.training.train import train


def test_a_shift_moves_the_picture_and_repeats_its_edge():
    img = torch.arange(2 * 3 * 4 * 5, dtype=torch.int64).reshape(2, 3, 4, 5).to(torch.uint8)
    assert torch.equal(shift_images(img, torch.zeros(2, 2, dtype=torch.long)), img)
    out = shift_images(img, torch.tensor([[1, 0], [0, -2]]))
    assert out.dtype == torch.uint8
    # image 0: output row y is input row y + 1, the last row repeated
    assert torch.equal(out[0, :, :3], img[0, :, 1:]) and torch.equal(out[0, :, 3], img[0, :, 3])
    # image 1: output column x is input column x - 2, the first column repeated into the gap
    assert torch.equal(out[1, :, :, 2:], img[1, :, :, :3])
    assert torch.equal(out[1, :, :, 0], img[1, :, :, 0]) and torch.equal(out[1, :, :, 1], img[1, :, :, 0])


def test_a_camera_padded_to_the_largest_shifts_within_its_own_size_and_keeps_its_padding():
    img = torch.zeros(1, 1, 4, 6)
    img[0, 0, :2, :3] = torch.tensor([[1.0, 2, 3], [4, 5, 6]])  # a 2x3 camera padded to 4x6
    out = shift_images(img, torch.tensor([[1, 1]]), torch.tensor([[2, 3]]))
    assert out[0, 0, :2, :3].tolist() == [[5.0, 6, 6], [5, 6, 6]]
    assert out[0, 0, 2:].abs().sum() == 0 and out[0, 0, :, 3:].abs().sum() == 0


def test_draws_depend_on_seed_step_and_sample_only():
    a = shifts([3, 7, 11], step=5, seed=0, shift=4, cameras=2)
    assert a.shape == (3, 2, 2) and int(a.abs().max()) <= 4
    # a sample's shift does not depend on which other samples share its batch (ranks split batches)
    assert torch.equal(shifts([7], 5, 0, 4, 2)[0], a[1])
    assert not torch.equal(shifts([3, 7, 11], 6, 0, 4, 2), a) and not torch.equal(shifts([3, 7, 11], 5, 1, 4, 2), a)
    many = shifts(list(range(400)), 0, 0, 2, 2)
    assert set(many.unique().tolist()) == {-2, -1, 0, 1, 2}


def test_the_recipe_refuses_a_shift_nothing_would_read():
    assert TrainRecipe(image_shift=3).image_shift == 3
    with pytest.raises(ValidationError, match="with_video false"):
        TrainRecipe(image_shift=3, with_video=False)
    with pytest.raises(ValidationError, match="family lerobot does not read it"):
        TrainRecipe(image_shift=3, policy_type="act")


def _cfg(ds, out, **kw) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), max_tokens=1024, lr=2e-3, warmup_steps=2, steps=8,
                lr_schedule="constant", checkpoint_every_steps=0, val_fraction=0.34,
                model_overrides={"image_size": [32, 32], "horizon": 8})
    return TrainConfig(**{**base, **kw})


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_training_sees_shifted_pictures_and_a_resumed_run_continues_exactly(tiny_v3, tmp_path):
    plain, shifted, resumed = tmp_path / "plain", tmp_path / "shifted", tmp_path / "resumed"
    train(_cfg(tiny_v3, plain))
    train(_cfg(tiny_v3, shifted, image_shift=3, checkpoint_every_steps=4))
    lp, ls = [r["loss"] for r in _rows(plain)], [r["loss"] for r in _rows(shifted)]
    assert len(lp) == len(ls) == 8 and lp != ls  # the same batches and noise: only the pictures differ
    assert json.loads((shifted / "config.json").read_text())["train"]["image_shift"] == 3
    # stopped after the checkpoint at step 4 and resumed: the uninterrupted run's weights, bit for bit
    train(_cfg(tiny_v3, resumed, image_shift=3, checkpoint_every_steps=4, steps=5))
    (resumed / "model.safetensors").unlink()
    train(_cfg(tiny_v3, resumed, image_shift=3, checkpoint_every_steps=4))
    w_shifted, w_resumed = load_file(shifted / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(w_resumed[k], w_shifted[k]) for k in w_shifted)
