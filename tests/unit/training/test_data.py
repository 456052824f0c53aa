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


def test_a_split_whose_frames_fit_the_frame_cache_is_decoded_once(lerobot_v3, monkeypatch):
    ds = V3Dataset(lerobot_v3, horizon=H)
    calls = []
    real = V3Dataset.decode_window
    monkeypatch.setattr(V3Dataset, "decode_window", lambda self, *a, **k: calls.append(a[:2]) or real(self, *a, **k))

    def three_epochs(cache_mb):
        calls.clear()
        s = SampleStream(ds, image_size=(16, 16), max_text_len=32, window=4, shuffle_buffer=8, seed=1,
                         cache_windows=2, cache_mb=cache_mb)
        seen = [(x.state.tolist(), x.images[0].sum().item(), x.images[1].sum().item())
                for x in islice(iter(s), 3 * len(ds))]
        return s, seen, len(calls)

    cached, seen_cached, decodes_cached = three_epochs(cache_mb=1)
    assert cached.cache_record() == {"frame_cache_mb": 1, "decoded_once": True,
                                     "decoded_mb": round(cached.num_windows * 4 * 2 * 16 * 16 * 3 / 2**20, 1)}
    assert "each frame is decoded once" in cached.cache_line()
    assert decodes_cached == cached.num_windows * 2  # every window of both cameras, once in three epochs
    plain, seen_plain, decodes_plain = three_epochs(cache_mb=0)
    assert not plain.cache_record()["decoded_once"] and "decoded again every epoch" in plain.cache_line()
    assert decodes_plain > 2 * plain.num_windows * 2
    assert seen_cached == seen_plain  # the cache changes how often frames are decoded, never which samples come


def test_byte_tokens():
    t = byte_tokens("pick", 10)
    assert t.tolist() == [256, *b"pick", 257]
    assert len(byte_tokens("x" * 100, 10)) == 10
