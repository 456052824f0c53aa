"""Every camera LeRobot stores reaches the model: video, PNGs in the parquet, depth maps.

The dataset is written by LeRobot's own writer (`LeRobotDataset.create` / `add_frame`), with three
cameras at three resolutions; the trained model must record all three, training must feed them,
and offline scoring must feed them again (what the conformance suite's frame equality is for).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from roboloop.offline import evaluate_offline
from roboloop.policies.vla import ModelPolicy
from roboloop.training.config import TrainConfig
from roboloop.training.data import SampleStream, V3Dataset
from roboloop.training.train import train
from tests.conformance.cases import LEROBOT_QUIET, lerobot_writer

pytestmark = LEROBOT_QUIET

CAMS = {"observation.images.front": (32, 48)}
IMAGES = {"observation.image": (24, 24)}
DEPTH = {"observation.images.depth": (24, 32)}
ALL = [*CAMS, *IMAGES, *DEPTH]


@pytest.fixture(scope="module")
def three_cameras(tmp_path_factory):
    root = tmp_path_factory.mktemp("cams") / "ds"
    lerobot_writer(CAMS, IMAGES, ["pick the cube", "push the block"], num_episodes=4, depth=DEPTH)(root)
    return root


def test_loader_lists_and_decodes_every_camera_kind(three_cameras):
    ds = V3Dataset(three_cameras)
    kinds = {c.key: (c.storage, c.depth, c.height, c.width) for c in ds.cameras}
    assert kinds == {"observation.images.front": ("video", False, 32, 48),
                     "observation.image": ("image", False, 24, 24),
                     "observation.images.depth": ("video", True, 24, 32)}
    depth = ds.decode_window(1, "observation.images.depth", 2, 3)
    assert depth.shape == (3, 24, 32, 1) and depth.dtype == np.float32
    # what the writer stored, in millimetres (LeRobot's lossless 12-bit log quantiser: < 0.35% off)
    want = 400 + 9 * 2 + 60 * 1 + np.arange(32)[None, :] * 20 + np.arange(24)[:, None] * 7
    np.testing.assert_allclose(depth[0, ..., 0], want, rtol=0.0035, atol=1)
    img = ds.decode_window(2, "observation.image", 0, 2, (12, 12))
    assert img.shape == (2, 12, 12, 3) and img.dtype == np.uint8
    stream = SampleStream(ds, (16, 16), 32, num_workers=1)
    sample = stream.materialize([5])[0]
    stream.close()
    assert len(sample.images) == 3 and all(x.shape == (3, 16, 16) for x in sample.images)
    d = sample.images[2]
    assert float(d.min()) >= 0 and float(d.max()) <= 1 and float(d.std()) > 0.05  # depth, scaled, not flat
    assert torch.equal(d[0], d[1])  # depth repeated on the encoder's three input channels


def test_trained_model_records_and_offline_scoring_feeds_all_cameras(three_cameras, tmp_path, monkeypatch):
    out = tmp_path / "model"
    train(TrainConfig(dataset=str(three_cameras), output_dir=str(out), steps=3, max_tokens=1024, warmup_steps=1,
                      checkpoint_every_steps=0, val_fraction=0.25,
                      model_overrides={"image_size": [16, 16], "horizon": 4}))
    data = json.loads((out / "config.json").read_text())["data"]
    assert data["camera_keys"] == ALL
    assert [c["storage"] for c in data["cameras"]] == ["video", "image", "video"]
    assert [c["depth"] for c in data["cameras"]] == [False, False, True]
    lo, hi = data["cameras"][2]["depth_mm"]
    assert 300 < lo < hi < 2000  # the dataset's depth range, in mm
    seen: list[int] = []
    real = ModelPolicy._images

    def spy(self, obs):
        imgs = real(self, obs)
        seen.append(len(imgs[0]))
        return imgs

    monkeypatch.setattr(ModelPolicy, "_images", spy)
    report = evaluate_offline(three_cameras, out)
    assert np.isfinite(report.mse_norm) and report.samples > 0
    assert seen and set(seen) == {3}


def test_a_model_trained_without_cameras_says_so(three_cameras, tmp_path):
    out = tmp_path / "blind"
    train(TrainConfig(dataset=str(three_cameras), output_dir=str(out), steps=2, max_tokens=1024, warmup_steps=1,
                      checkpoint_every_steps=0, with_video=False, model_overrides={"image_size": [16, 16],
                                                                                    "horizon": 4}))
    data = json.loads((out / "config.json").read_text())["data"]
    assert data["camera_keys"] == []
    assert [c["key"] for c in data["cameras_not_used"]] == ALL
