"""Fast loader of LeRobot v3.0 datasets into training samples.

State and action columns are read once from the data parquet files (memory-mapped) into
contiguous float32 arrays, so an action chunk is a slice, not a lookup per frame. Chunks
follow LeRobotDataset's convention: frames past the episode end repeat the last frame and
are flagged padded. Video is decoded in episode order (one sequential decode per window
instead of one seek per sample) and resized on decode by FFmpeg's scaler; producer threads
(PyAV releases the GIL while decoding) feed a bounded queue and a shuffle buffer mixes
windows from different episodes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from roboloop.datasets import layout
from roboloop.datasets.meta import DatasetMeta, load_meta
from roboloop.training.packing import Sample

BOS, EOS = 256, 257


def byte_tokens(text: str, max_len: int) -> torch.Tensor:
    ids = [BOS, *text.encode("utf-8")[: max_len - 2], EOS]
    return torch.tensor(ids, dtype=torch.long)


def _column_2d(table: pa.Table, name: str) -> np.ndarray:
    col = table[name].combine_chunks()
    if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) or pa.types.is_large_list(col.type):
        return col.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(col), -1)
    return col.to_numpy(zero_copy_only=False).astype(np.float32)[:, None]


@dataclass
class Normalizer:
    """Mean/std normalisation from the dataset's stats (what the trained model stores)."""

    mean: dict[str, np.ndarray]
    std: dict[str, np.ndarray]

    @classmethod
    def from_meta(cls, meta: DatasetMeta, keys: list[str]) -> Normalizer:
        if meta.stats is None:
            raise ValueError(f"{meta.root}: no meta/stats.json; cannot normalise {keys}")
        return cls({k: meta.stats[k]["mean"].astype(np.float32) for k in keys},
                   {k: np.maximum(meta.stats[k]["std"], 1e-6).astype(np.float32) for k in keys})

    def __call__(self, key: str, x: np.ndarray) -> np.ndarray:
        return (x - self.mean[key]) / self.std[key]

    def unnormalize(self, key: str, x: np.ndarray) -> np.ndarray:
        return x * self.std[key] + self.mean[key]


class V3Dataset:
    """Random access to (state, action chunk, task) of a v3 dataset; video through `decode_window`."""

    def __init__(self, root: str | Path, horizon: int = 16, state_key: str = "observation.state",
                 action_key: str = "action"):
        self.meta = load_meta(root)
        if self.meta.version != layout.V30:
            raise ValueError(f"{root} is {self.meta.version}: convert it to v3.0 first (roboloop convert)")
        self.root = Path(root)
        self.horizon = horizon
        self.state_key, self.action_key = state_key, action_key
        files = sorted({(ep.data_chunk_index, ep.data_file_index) for ep in self.meta.episodes})
        tables = []
        for chunk, file in files:
            path = self.root / self.meta.info.data_path.format(chunk_index=chunk, file_index=file)
            tables.append(pq.read_table(path, columns=[state_key, action_key, "index", "episode_index",
                                                       "frame_index", "task_index"], memory_map=True))
        table = pa.concat_tables(tables)
        order = np.argsort(table["index"].to_numpy())
        self.state = _column_2d(table, state_key)[order]
        self.action = _column_2d(table, action_key)[order]
        self.episode_index = table["episode_index"].to_numpy()[order]
        self.frame_index = table["frame_index"].to_numpy()[order]
        self.task_index = table["task_index"].to_numpy()[order]
        self.ep_from: dict[int, int] = {ep.episode_index: int(ep.dataset_from_index or 0) for ep in self.meta.episodes}
        self.ep_to: dict[int, int] = {ep.episode_index: int(ep.dataset_to_index or 0) for ep in self.meta.episodes}
        self.video_keys = self.meta.info.video_keys

    def __len__(self) -> int:
        return len(self.state)

    def action_chunk(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(H, A) actions from frame i on, the last frame repeated past the episode end, and the pad flags."""
        end = self.ep_to[int(self.episode_index[i])]
        idx = np.arange(i, i + self.horizon)
        pad = idx >= end
        return self.action[np.minimum(idx, end - 1)], pad

    def task(self, i: int) -> str:
        return self.meta.tasks[int(self.task_index[i])]

    def video_location(self, episode: int, key: str) -> tuple[Path, float]:
        ep = self.meta.episodes[episode]
        loc = ep.videos[key]
        path = self.root / self.meta.info.video_path.format(  # type: ignore[union-attr]
            video_key=key, chunk_index=int(loc["chunk_index"]), file_index=int(loc["file_index"]))
        return path, float(loc["from_timestamp"])

    def decode_window(self, episode: int, key: str, first: int, count: int,
                      size: tuple[int, int]) -> np.ndarray:
        """Frames first..first+count-1 of an episode's camera, resized to size=(H, W): (count, H, W, 3) uint8."""
        path, offset = self.video_location(episode, key)
        fps = self.meta.info.fps
        t0 = offset + first / fps
        out = np.empty((count, size[0], size[1], 3), dtype=np.uint8)
        got = 0
        with av.open(str(path)) as container:
            st = container.streams.video[0]
            st.thread_type = "AUTO"
            tb = float(st.time_base)  # type: ignore[arg-type]
            container.seek(int(t0 / tb), stream=st, backward=True)
            for frame in container.decode(st):
                t = frame.pts * tb
                if t < t0 - 0.5 / fps:
                    continue
                out[got] = frame.to_ndarray(format="rgb24", width=size[1], height=size[0])
                got += 1
                if got == count:
                    break
        if got != count:
            raise ValueError(f"{path}: episode {episode} has only {got} of {count} frames from frame {first}")
        return out


class SampleStream:
    """Infinite, seeded, resumable stream of `Sample`s.

    Windows of `window` consecutive frames are visited in a per-epoch shuffled order (this
    rank's shard). Their frames enter a shuffle buffer; each window's video is decoded once,
    by a thread pool, as soon as it enters the buffer (prefetch: decoding overlaps training).
    The order depends only on the seed, so `state_dict()` (epoch, cursor, buffer, RNG) lets a
    restarted run continue with exactly the samples an uninterrupted run would have seen.
    """

    def __init__(self, ds: V3Dataset, image_size: tuple[int, int], max_text_len: int, window: int = 32,
                 shuffle_buffer: int = 512, num_workers: int = 2, seed: int = 0, rank: int = 0,
                 world_size: int = 1, normalizer: Normalizer | None = None, with_video: bool = True):
        self.ds, self.image_size, self.max_text_len = ds, image_size, max_text_len
        self.window, self.shuffle_buffer, self.num_workers = window, shuffle_buffer, max(1, num_workers)
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.norm, self.with_video = normalizer, with_video and bool(ds.video_keys)
        self.epoch, self.cursor = 0, 0
        self.buffer: list[int] = []  # global frame indices
        self.rng = random.Random(seed * 7919 + rank)
        self._pending: dict[tuple[int, int], Future] = {}
        self._left: dict[tuple[int, int], int] = {}
        self._pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="roboloop-decode")

    def _windows(self, epoch: int) -> list[tuple[int, int, int]]:
        """(episode, first frame, count) of this rank, shuffled per epoch."""
        wins = [(ep.episode_index, first, min(self.window, ep.length - first))
                for ep in self.ds.meta.episodes for first in range(0, ep.length, self.window)]
        random.Random(self.seed * 1_000_003 + epoch).shuffle(wins)
        return wins[self.rank :: self.world_size]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "buffer": list(self.buffer),
                "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self.buffer = list(state["buffer"])
        rng = state["rng"]
        self.rng.setstate((rng[0], tuple(rng[1]), rng[2]))
        for key in self.buffer:
            self._schedule(self._window_of(key))

    def _window_of(self, key: int) -> tuple[int, int, int]:
        ep = int(self.ds.episode_index[key])
        first = (int(self.ds.frame_index[key]) // self.window) * self.window
        length = self.ds.ep_to[ep] - self.ds.ep_from[ep]
        return ep, first, min(self.window, length - first)

    def _schedule(self, win: tuple[int, int, int]) -> None:
        ep, first, count = win
        if (ep, first) not in self._pending:
            self._pending[(ep, first)] = self._pool.submit(self._decode, ep, first, count)
            self._left[(ep, first)] = 0
        self._left[(ep, first)] += 1

    def _decode(self, ep: int, first: int, count: int) -> dict[str, np.ndarray]:
        if not self.with_video:
            return {}
        return {k: self.ds.decode_window(ep, k, first, count, self.image_size) for k in self.ds.video_keys}

    def _fill(self) -> None:
        while len(self.buffer) < self.shuffle_buffer:
            wins = self._windows(self.epoch)
            if self.cursor >= len(wins):
                self.epoch, self.cursor = self.epoch + 1, 0
                continue
            win = wins[self.cursor]
            self.cursor += 1
            start = self.ds.ep_from[win[0]] + win[1]
            self.buffer.extend(range(start, start + win[2]))
            for _ in range(win[2]):
                self._schedule(win)

    def _sample(self, key: int) -> Sample:
        ds = self.ds
        ep, first, _ = self._window_of(key)
        frames = self._pending[(ep, first)].result()
        self._left[(ep, first)] -= 1
        if self._left[(ep, first)] == 0:
            del self._pending[(ep, first)], self._left[(ep, first)]
        j = int(ds.frame_index[key]) - first
        actions, pad = ds.action_chunk(key)
        state = ds.state[key]
        if self.norm is not None:
            actions, state = self.norm(ds.action_key, actions), self.norm(ds.state_key, state)
        images = [torch.from_numpy(frames[k][j]).permute(2, 0, 1).float().div_(255) for k in frames]
        return Sample(images=images, instruction=byte_tokens(ds.task(key), self.max_text_len),
                      state=torch.from_numpy(np.ascontiguousarray(state, dtype=np.float32)),
                      actions=torch.from_numpy(np.ascontiguousarray(actions, dtype=np.float32)),
                      action_mask=torch.from_numpy(~pad))

    def __iter__(self) -> Iterator[Sample]:
        while True:
            self._fill()
            k = self.rng.randrange(len(self.buffer))
            self.buffer[k], self.buffer[-1] = self.buffer[-1], self.buffer[k]
            yield self._sample(self.buffer.pop())

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
