"""Continuing from a damaged model fails before the run claims its folder, naming the file."""

from __future__ import annotations

import shutil

import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.errors import CorruptFileError
from roboloop.training.config import TrainConfig
from roboloop.training.train import train

OVER = {"horizon": 4, "dim": 32, "head_dim_model": 32}


def test_a_truncated_init_from_is_named_and_claims_nothing(tmp_path):
    src = generate_v21(tmp_path / "v21", GenSpec(num_episodes=2, min_length=10, max_length=12, cameras={}, seed=5))
    ds = convert(src, tmp_path / "v3", ConvertConfig(progress=False))
    base = tmp_path / "base"
    train(TrainConfig(dataset=str(ds), output_dir=str(base), steps=2, max_tokens=256, checkpoint_every_steps=0,
                      with_video=False, model_overrides=OVER))
    for cut in (100, 7):  # inside the header, inside the weights
        bad = shutil.copytree(base, tmp_path / f"bad{cut}")
        weights = bad / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[:cut] if cut < 50 else data[: len(data) - cut])
        out = tmp_path / f"cont{cut}"
        with pytest.raises(CorruptFileError, match=f"bad{cut}/model.safetensors cannot be read"):
            train(TrainConfig(dataset=str(ds), output_dir=str(out), steps=4, max_tokens=256, with_video=False,
                              checkpoint_every_steps=0, init_from=str(bad), model_overrides=OVER))
        assert not out.exists() or not (out / "run_config.json").exists()
