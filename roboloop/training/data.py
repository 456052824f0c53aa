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

import queue
import random
import threading
from collections.abc import Iterator
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
        self.ep_from = {ep.episode_index: ep.dataset_from_index for ep in self.meta.episodes}
        self.ep_to = {ep.episode_index: ep.dataset_to_index for ep in self.meta.episodes}
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
            tb = float(st.time_base)
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
    """Infinite, seeded stream of `Sample`s: windows decoded by producer threads, mixed in a shuffle buffer."""

    def __init__(self, ds: V3Dataset, image_size: tuple[int, int], max_text_len: int, window: int = 32,
                 shuffle_buffer: int = 512, num_workers: int = 2, seed: int = 0, rank: int = 0,
                 world_size: int = 1, normalizer: Normalizer | None = None, with_video: bool = True):
        self.ds, self.image_size, self.max_text_len = ds, image_size, max_text_len
        self.window, self.shuffle_buffer, self.num_workers = window, shuffle_buffer, num_workers
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.norm, self.with_video = normalizer, with_video and bool(ds.video_keys)

    def _windows(self, worker: int, epoch: int) -> list[tuple[int, int, int]]:
        """(episode, first frame, count) of this rank and worker, shuffled per epoch."""
        wins = []
        for ep in self.ds.meta.episodes:
            for first in range(0, ep.length, self.window):
                wins.append((ep.episode_index, first, min(self.window, ep.length - first)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(wins)
        shard = self.rank * self.num_workers + worker
        return wins[shard :: self.world_size * self.num_workers]

    def _make(self, episode: int, first: int, count: int) -> list[Sample]:
        ds = self.ds
        start = ds.ep_from[episode] + first
        frames = {k: ds.decode_window(episode, k, first, count, self.image_size) for k in ds.video_keys} \
            if self.with_video else {}
        out = []
        for j in range(count):
            i = start + j
            actions, pad = ds.action_chunk(i)
            state = ds.state[i]
            if self.norm is not None:
                actions, state = self.norm(ds.action_key, actions), self.norm(ds.state_key, state)
            images = [torch.from_numpy(frames[k][j]).permute(2, 0, 1).float().div_(255) for k in frames]
            out.append(Sample(images=images, instruction=byte_tokens(ds.task(i), self.max_text_len),
                              state=torch.from_numpy(np.ascontiguousarray(state)),
                              actions=torch.from_numpy(np.ascontiguousarray(actions)),
                              action_mask=torch.from_numpy(~pad)))
        return out

    def __iter__(self) -> Iterator[Sample]:
        q: queue.Queue = queue.Queue(maxsize=max(4, 2 * self.num_workers))
        stop = threading.Event()

        def produce(worker: int) -> None:
            epoch = 0
            while not stop.is_set():
                for win in self._windows(worker, epoch):
                    if stop.is_set():
                        return
                    q.put(self._make(*win))
                epoch += 1

        threads = [threading.Thread(target=produce, args=(w,), daemon=True) for w in range(self.num_workers)]
        for t in threads:
            t.start()
        rng = random.Random(self.seed + 17 * self.rank)
        buf: list[Sample] = []
        try:
            while True:
                buf.extend(q.get())
                while len(buf) > self.shuffle_buffer // 2:
                    k = rng.randrange(len(buf))
                    buf[k], buf[-1] = buf[-1], buf[k]
                    yield buf.pop()
        finally:
            stop.set()
            while not q.empty():
                q.get_nowait()
