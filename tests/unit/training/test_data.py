"""The loader against LeRobotDataset on a LeRobot-written v3 dataset."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from itertools import islice

import numpy as np
import pytest

from roboloop.datasets import video
from roboloop.training.data import SampleStream, V3Dataset, byte_tokens

H = 8


@pytest.fixture(scope="module")
def lerobot_v3(small_v21, tmp_path_factory):
    """A v3 dataset written by LeRobot's own converter."""
    root = tmp_path_factory.mktemp("lr") / "ds"
    shutil.copytree(small_v21, root)
    subprocess.run([sys.executable, "-m", "lerobot.scripts.convert_dataset_v21_to_v30", "--repo-id=t/ds",
                    f"--root={root}", "--push-to-hub=false"], check=True, capture_output=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return root


def test_chunks_equal_lerobot_dataset(lerobot_v3):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ours = V3Dataset(lerobot_v3, horizon=H)
    fps = ours.meta.info.fps
    ref = LeRobotDataset("t/ds", root=lerobot_v3, delta_timestamps={"action": [i / fps for i in range(H)]})
    assert len(ref) == len(ours)
    for i in range(len(ours)):
        item = ref[i]
        actions, pad = ours.action_chunk(i)
        np.testing.assert_array_equal(actions, item["action"].numpy())
        np.testing.assert_array_equal(pad, item["action_is_pad"].numpy())
        np.testing.assert_array_equal(ours.state[i], item["observation.state"].numpy())
        assert ours.task(i) == item["task"]


def test_decode_window_equals_source_frames(small_v21, lerobot_v3):
    ds = V3Dataset(lerobot_v3, horizon=H)
    ep = ds.meta.episodes[3]
    key = "observation.images.top"
    frames = ds.decode_window(3, key, 2, 5, size=(48, 64))
    src = small_v21 / f"videos/chunk-000/{key}/episode_000003.mp4"
    expected = video.decode_frames_at(src, [(2 + j) / ds.meta.info.fps for j in range(5)])
    np.testing.assert_array_equal(frames, expected)
    assert ep.length >= 7


def test_stream_shapes_and_token_counts(lerobot_v3):
    ds = V3Dataset(lerobot_v3, horizon=H)
    s = SampleStream(ds, image_size=(32, 32), max_text_len=64, window=4, shuffle_buffer=16, num_workers=2)
    samples = list(islice(iter(s), 40))
    assert len(samples) == 40
    assert all(len(x.images) == 2 and x.images[0].shape == (3, 32, 32) for x in samples)
    assert all(x.actions.shape == (H, 6) for x in samples)
    keys = [s.next_key() for _ in range(10)]
    assert all(s.num_tokens(k, 4) == x.num_tokens(4) for k, x in zip(keys, s.materialize(keys), strict=True))


def test_stream_resumes_exactly(lerobot_v3):
    ds = V3Dataset(lerobot_v3, horizon=H)

    def stream():
        return SampleStream(ds, image_size=(16, 16), max_text_len=32, window=4, shuffle_buffer=10, seed=3)

    full = [(s.state.tolist(), s.images[0].sum().item()) for s in islice(iter(stream()), 60)]
    first = stream()
    it = iter(first)
    head = [(s.state.tolist(), s.images[0].sum().item()) for s in islice(it, 25)]
    state = first.state_dict()
    second = stream()
    second.load_state_dict(state)
    tail = [(s.state.tolist(), s.images[0].sum().item()) for s in islice(iter(second), 35)]
    assert head + tail == full


def test_byte_tokens():
    t = byte_tokens("pick", 10)
    assert t.tolist() == [256, *b"pick", 257]
    assert len(byte_tokens("x" * 100, 10)) == 10
