"""Fast loader of LeRobot v3.0 datasets into training samples.

State and action columns are read once from the data parquet files (memory-mapped) into
contiguous float32 arrays, so an action chunk is a slice, not a lookup per frame. Chunks
follow LeRobotDataset's convention: frames past the episode end repeat the last frame and
are flagged padded. Every camera LeRobot stores is read (`roboloop.datasets.cameras`): video
is decoded in episode order (one sequential decode per window instead of one seek per sample)
and resized on decode by FFmpeg's scaler; images stored in the parquet are decoded from their
PNG/JPEG bytes; depth maps come back in millimetres, as LeRobot's loader returns them. Decoding
runs on threads (PyAV and PIL release the GIL) and a shuffle buffer mixes windows from
different episodes.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import torch

from roboloop.datasets import cameras as cams
from roboloop.datasets import layout
from roboloop.datasets.arrowutil import np_col, read_table, to_2d
from roboloop.datasets.meta import DatasetMeta, load_meta
from roboloop.errors import CorruptFileError
from roboloop.training.packing import Sample

BOS, EOS = 256, 257


def byte_tokens(text: str, max_len: int) -> torch.Tensor:
    """BOS, the text's UTF-8 bytes, EOS: at most `max_len` ids, and never fewer than BOS and EOS."""
    ids = [BOS, *text.encode("utf-8")[: max(max_len - 2, 0)], EOS]
    return torch.tensor(ids, dtype=torch.long)


def _column_2d(table: pa.Table, name: str) -> np.ndarray:
    return to_2d(table[name], np.float32)


@dataclass
class Normalizer:
    """Mean/std normalisation from the dataset's stats (what the trained model stores)."""

    mean: dict[str, np.ndarray]
    std: dict[str, np.ndarray]

    @classmethod
    def from_meta(cls, meta: DatasetMeta, keys: list[str]) -> Normalizer:
        st = meta.dataset_stats()
        missing = [k for k in keys if k not in st]
        if missing:
            raise ValueError(f"{meta.root}: no stats for {missing}; cannot normalise them")
        return cls({k: st[k]["mean"].astype(np.float32) for k in keys},
                   {k: np.maximum(st[k]["std"], 1e-6).astype(np.float32) for k in keys})

    @classmethod
    def from_stats(cls, stats: dict, keys: list[str], where: object = "") -> Normalizer:
        """From a stats.json-shaped dict ({key: {"mean": [...], "std": [...], ...}})."""
        missing = [k for k in keys if k not in stats]
        if missing:
            raise ValueError(f"{where}: no stats for {missing}; cannot normalise them")
        return cls({k: np.asarray(stats[k]["mean"], dtype=np.float32) for k in keys},
                   {k: np.maximum(np.asarray(stats[k]["std"], dtype=np.float32), 1e-6) for k in keys})

    def __call__(self, key: str, x: np.ndarray) -> np.ndarray:
        return (x - self.mean[key]) / self.std[key]

    def unnormalize(self, key: str, x: np.ndarray) -> np.ndarray:
        return x * self.std[key] + self.mean[key]


class EpisodeTableError(CorruptFileError):
    """meta/episodes disagrees with the data rows: training would read the wrong frames."""


def check_episode_table(root: Path, meta: DatasetMeta, index: np.ndarray, episode: np.ndarray,
                        frame: np.ndarray) -> None:
    """Refuse what `roboloop validate` refuses before a single sample is drawn: every episode's window
    [dataset_from_index, dataset_to_index) must hold exactly that episode's rows, frames 0..length-1 in order,
    the windows must tile the rows, and the global `index` must number them 0..N-1. Names the episode."""
    where = f"{root / 'meta/episodes'}"
    n = len(index)
    if n and not np.array_equal(index, np.arange(n)):
        bad = int(np.flatnonzero(index != np.arange(n))[0])
        raise EpisodeTableError(f"{root / 'data'}: the index column is not 0..{n - 1} (row {bad} holds "
                                f"{int(index[bad])}): rows are missing or duplicated; check it with roboloop validate")
    seen: set[int] = set()
    covered = 0
    for ep in meta.episodes:
        e, lo, hi = ep.episode_index, int(ep.dataset_from_index or 0), int(ep.dataset_to_index or 0)
        if e in seen:
            raise EpisodeTableError(f"{where}: episode {e} is listed twice")
        seen.add(e)
        if ep.length <= 0:
            raise EpisodeTableError(f"{where}: episode {e} has length {ep.length}; an episode needs frames")
        if hi - lo != ep.length or lo < 0 or hi > n:
            raise EpisodeTableError(f"{where}: episode {e}: dataset_from_index {lo} .. dataset_to_index {hi} does "
                                    f"not span its length {ep.length} within the {n} rows")
        if not (np.all(episode[lo:hi] == e) and np.array_equal(frame[lo:hi], np.arange(hi - lo))):
            found = sorted({int(x) for x in episode[lo:hi]})[:3]
            raise EpisodeTableError(f"{where}: episode {e}'s rows {lo}..{hi - 1} hold episode(s) {found}, frames "
                                    f"{int(frame[lo])}..{int(frame[hi - 1])}: the table does not match the data "
                                    "(check it with roboloop validate)")
        covered += hi - lo
    if covered != n:
        missing = sorted({int(x) for x in np.unique(episode)} - seen)
        raise EpisodeTableError(f"{where}: its episodes cover {covered} of the {n} data rows; episode(s) "
                                f"{missing[:5]} of the data are not in the table")


class V3Dataset:
    """Random access to (state, action chunk, task) of a v3 dataset; every camera through `decode_window`."""

    def __init__(self, root: str | Path, horizon: int = 16, state_key: str = "observation.state",
                 action_key: str = "action", aux_key: str | None = None, env_key: str | None = None):
        """`env_key`: a feature offered to the policy as an input (observation.environment_state), loaded when the
        dataset has it (`env_state` is None otherwise)."""
        self.meta = load_meta(root)
        if self.meta.version != layout.V30:
            raise ValueError(f"{root} is {self.meta.version}: convert it to v3.0 first (roboloop convert)")
        self.root = Path(root)
        self.horizon = horizon
        self.state_key, self.action_key, self.aux_key = state_key, action_key, aux_key
        self.env_key = env_key if env_key in self.meta.info.features else None
        extra = [k for k in dict.fromkeys([aux_key, self.env_key]) if k]
        if aux_key is not None and aux_key not in self.meta.info.features:
            raise ValueError(f"{root}: the auxiliary target {aux_key!r} is not a feature of this dataset (it has "
                             f"{sorted(self.meta.info.features)}); record it (roboloop collect records "
                             "observation.environment_state for the -Vision- task) or drop aux_target")
        self.cameras = cams.cameras(self.meta.info)
        self.camera_keys = [c.key for c in self.cameras]
        self.video_keys = [c.key for c in self.cameras if c.storage == "video"]
        image_keys = [c.key for c in self.cameras if c.storage == "image"]
        files = sorted({(ep.data_chunk_index, ep.data_file_index) for ep in self.meta.episodes})
        tables = []
        for chunk, file in files:
            path = self.root / self.meta.info.data_path.format(chunk_index=chunk, file_index=file)
            tables.append(read_table(path, columns=[state_key, action_key, *extra, "index",
                                                       "episode_index", "frame_index", "task_index", *image_keys],
                                     memory_map=True))
        table = pa.concat_tables(tables)
        order = np.argsort(np_col(table["index"]))
        # image cameras stay as their encoded bytes (memory-mapped); frame i is row order[i] of the table
        self._image_cols = {k: table[k] for k in image_keys}
        self._row = order
        self.state = _column_2d(table, state_key)[order]
        self.action = _column_2d(table, action_key)[order]
        self.aux = _column_2d(table, aux_key)[order] if aux_key else None
        self.env_state = _column_2d(table, self.env_key)[order] if self.env_key else None
        self.episode_index = np_col(table["episode_index"])[order]
        self.frame_index = np_col(table["frame_index"])[order]
        self.task_index = np_col(table["task_index"])[order]
        self.ep_from: dict[int, int] = {ep.episode_index: int(ep.dataset_from_index or 0) for ep in self.meta.episodes}
        self.ep_to: dict[int, int] = {ep.episode_index: int(ep.dataset_to_index or 0) for ep in self.meta.episodes}
        self._camera = {c.key: c for c in self.cameras}
        check_episode_table(self.root, self.meta, np_col(table["index"])[order], self.episode_index, self.frame_index)
        for key, arr in ((state_key, self.state), (action_key, self.action), (aux_key, self.aux),
                         (self.env_key, self.env_state)):
            if arr is not None and not np.isfinite(arr).all():
                row = int(np.flatnonzero(~np.isfinite(arr).all(axis=1))[0])
                ep, frame = int(self.episode_index[row]), int(self.frame_index[row])
                raise CorruptFileError(f"{self.root}: {key} is NaN or infinite in episode {ep} frame {frame} (and "
                                       "maybe more): training would learn NaN; fix or drop that episode (roboloop "
                                       "validate lists them all)")

    def __len__(self) -> int:
        return len(self.state)

    def action_chunk(self, i: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(H, A) actions from frame i + start on (start < 0: from before frame i, as history policies are
        trained), the episode's first/last frame repeated outside it (LeRobot's clamping), and the pad flags."""
        ep = int(self.episode_index[i])
        begin, end = self.ep_from[ep], self.ep_to[ep]
        idx = np.arange(i + start, i + start + self.horizon)
        pad = (idx >= end) | (idx < begin)
        return self.action[np.clip(idx, begin, end - 1)], pad

    def task(self, i: int) -> str:
        return self.meta.tasks[int(self.task_index[i])]

    def video_location(self, episode: int, key: str) -> tuple[Path, float]:
        ep = self.meta.episodes[episode]
        loc = ep.videos[key]
        path = self.root / self.meta.info.video_path.format(  # type: ignore[union-attr]
            video_key=key, chunk_index=int(loc["chunk_index"]), file_index=int(loc["file_index"]))
        return path, float(loc["from_timestamp"])

    def decode_window(self, episode: int, key: str, first: int, count: int,
                      size: tuple[int, int] | None = None) -> np.ndarray:
        """Frames first..first+count-1 of an episode's camera, resized to size=(H, W) (None: as stored):
        (count, H, W, 3) uint8 for colour, (count, H, W, 1) float32 millimetres for depth."""
        cam = self._camera[key]
        size = size or (cam.height, cam.width)
        if cam.storage == "image":
            return self._decode_images(cam, episode, first, count, size)
        path, offset = self.video_location(episode, key)
        fps = self.meta.info.fps
        t0 = offset + first / fps
        out = np.empty((count, size[0], size[1], 1 if cam.depth else 3), dtype=np.float32 if cam.depth else np.uint8)
        got = 0
        try:
            with av.open(str(path)) as container:
                st = container.streams.video[0]
                st.thread_type = "AUTO"
                tb = float(st.time_base)  # type: ignore[arg-type]
                # HEVC (LeRobot's depth maps) can land on a recovery point whose leading frames the decoder
                # drops, so the first frame out is later than asked: then seek from further back.
                for seek_s in (t0, t0 - 2.0, 0.0):
                    container.seek(max(0, int(seek_s / tb)), stream=st, backward=True)
                    got, late = 0, False
                    for frame in container.decode(st):
                        t = frame.pts * tb
                        if t < t0 - 0.5 / fps:
                            continue
                        if got == 0 and t > t0 + 0.5 / fps and seek_s > 0:
                            late = True
                            break
                        out[got] = cams.decode_video_frame(frame, cam, size)
                        got += 1
                        if got == count:
                            break
                    if not late:
                        break
        except (av.error.FFmpegError, OSError) as e:
            raise CorruptFileError(f"{path}: episode {episode}, camera {key}: cannot decode frames from {first} "
                                   f"({e}); the video is damaged (check it with roboloop validate --deep)") from e
        if got != count:
            raise CorruptFileError(f"{path}: episode {episode}, camera {key} has only {got} of {count} frames from "
                                   f"frame {first}; the video is cut short (check it with roboloop validate --deep)")
        return out

    def _decode_images(self, cam: cams.Camera, episode: int, first: int, count: int,
                       size: tuple[int, int]) -> np.ndarray:
        col, start = self._image_cols[cam.key], self.ep_from[episode] + first
        if first + count > self.ep_to[episode] - self.ep_from[episode]:
            raise IndexError(f"{self.root}: episode {episode} has no frames {first}..{first + count - 1}")
        frames = [cams.decode_image_cell(col[int(self._row[i])].as_py(), cam, self.root, size,
                                         f"{self.root} episode {episode} frame {i - self.ep_from[episode]}")
                  for i in range(start, start + count)]
        return np.stack(frames)

    def depth_ranges(self, stats: dict) -> dict[str, tuple[float, float]]:
        """(lo, hi) mm each depth camera is scaled from (what the model stores with its stats)."""
        return {c.key: cams.depth_range(stats, c.key, c) for c in self.cameras if c.depth}


class SampleStream:
    """Infinite, seeded, resumable stream of frame keys, materialised into `Sample`s on demand.

    Windows of `window` consecutive frames are visited in a per-epoch shuffled order; their
    frame keys (global indices) enter a shuffle buffer. Keys are cheap: packing, rank
    sharding and loss normalisation all work on keys, and only the samples a rank needs are
    materialised. Materialising decodes each needed window once, on a thread pool, so the
    windows of a whole pack decode in parallel (and the next pack can be prefetched). The
    key order depends only on the seed, so `state_dict()` (epoch, cursor, buffer, RNG) lets a
    restarted run continue with exactly the samples an uninterrupted run would have seen.
    With `order="uniform"` each epoch is instead a seeded permutation of the split's frames (LeRobot's
    shuffled DataLoader); the windows are still what is decoded and cached.
    """

    def __init__(self, ds: V3Dataset, image_size: tuple[int, int] | None, max_text_len: int, window: int = 32,
                 shuffle_buffer: int = 512, num_workers: int = 2, seed: int = 0,
                 normalizer: Normalizer | None = None, with_video: bool = True, cache_windows: int = 256,
                 tokenizer: str | None = None, state_tokens: int = 1, episodes: list[int] | None = None,
                 depth_mm: dict[str, tuple[float, float]] | None = None, cameras: list[str] | None = None,
                 history: int = 1, drop_last: int = 0, cache_mb: float = 0, env_state: bool = False,
                 order: str = "windows"):
        self.ds, self.image_size, self.max_text_len = ds, image_size, max_text_len  # image_size None: as stored
        if env_state and ds.env_state is None:
            raise ValueError(f"{ds.root}: the policy reads {ds.env_key or 'observation.environment_state'}, which "
                             "this dataset does not have")
        self.env_state = env_state  # each sample carries ds.env_state (raw; its history frames too)
        # the cameras fed, in the dataset's order (None: all of them)
        self.cams = [k for k in ds.camera_keys if cameras is None or k in cameras]
        # observation frames per sample (current + history - 1 before it, clamped to the episode's first frame);
        # > 1 also starts the action chunk at the oldest of them (LeRobot's n_obs_steps)
        self.history = history
        # the episodes samples are drawn from (the training split); None: all of them
        self.episodes = None if episodes is None else set(episodes)
        if self.episodes is not None and not self.episodes:
            raise ValueError(f"{ds.root}: no episode left to train on")
        # frames at each episode's end never drawn as samples (LeRobot's `drop_n_last_frames`: Diffusion's chunk
        # would be mostly padding there); still decoded as history and read as action targets
        if drop_last < 0:
            raise ValueError(f"drop_last must be >= 0, got {drop_last}")
        self.drop_last = drop_last
        if drop_last and not any(ep.length > drop_last for ep in ds.meta.episodes
                                 if self.episodes is None or ep.episode_index in self.episodes):
            raise ValueError(f"{ds.root}: no episode is longer than the {drop_last} last frames dropped from each "
                             f"(drop_n_last_frames): nothing left to train on")
        self.state_tokens = state_tokens  # backbone tokens the model gives the state (see ModelConfig)
        self.window, self.shuffle_buffer, self.num_workers = window, shuffle_buffer, max(1, num_workers)
        self.seed, self.norm = seed, normalizer
        self.with_video = with_video and bool(self.cams)
        # the range each depth camera is scaled from: the model's own (continued training), else this dataset's
        self.depth_mm = depth_mm if depth_mm is not None else \
            ds.depth_ranges(ds.meta.dataset_stats()) if self.with_video else {}
        if order not in ("windows", "uniform"):
            raise ValueError(f"sample order {order!r}: windows or uniform")
        self.order = order
        self.epoch, self.cursor = 0, 0
        self._memo: tuple[tuple[str, int], Any] | None = None  # the last epoch's order
        self.buffer: list[int] = []  # global frame indices
        self.rng = random.Random(seed * 7919)
        self._cache: OrderedDict[tuple[int, int], Future] = OrderedDict()
        # decoded windows kept (least recently used dropped): at least `cache_windows` (those in flight), and as
        # many as `cache_mb` holds, so a split whose frames fit is decoded once, not once per epoch
        self.window_bytes = self.frame_bytes() * (window + history - 1)
        self.num_windows = len(self._windows(0))
        self._cache_windows = max(cache_windows, int(cache_mb * 2**20 // self.window_bytes) if self.window_bytes else 0)
        self.cache_mb = cache_mb
        self._pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="roboloop-decode")
        if tokenizer:
            from roboloop.training.hf import text_tokens

            self._tokens = {i: text_tokens(tokenizer, t, max_text_len) for i, t in ds.meta.tasks.items()}
        else:
            self._tokens = {i: byte_tokens(t, max_text_len) for i, t in ds.meta.tasks.items()}

    def frame_bytes(self) -> int:
        """Bytes one decoded frame of every fed camera takes (colour uint8 RGB, depth float32); 0 without video."""
        if not self.with_video:
            return 0
        total = 0
        for cam in self.ds.cameras:
            if cam.key in self.cams:
                h, w = self.image_size if self.image_size is not None else (cam.height, cam.width)
                total += h * w * (4 if cam.depth else 3)
        return total

    def cache_record(self) -> dict:
        """What the run log and the run record say about the decoded-frame cache."""
        need = self.window_bytes * self.num_windows
        return {"frame_cache_mb": self.cache_mb, "decoded_mb": round(need / 2**20, 1),
                "decoded_once": bool(self.with_video and self.num_windows <= self._cache_windows)}

    def cache_line(self) -> str:
        rec = self.cache_record()
        if not self.with_video:
            return "frame cache: no camera fed"
        fit = "within frame_cache_mb {:g}: each frame is decoded once" if rec["decoded_once"] else \
            "more than frame_cache_mb {:g}: frames are decoded again every epoch"
        return (f"frame cache: the {self.num_windows} windows of the training split take {rec['decoded_mb']} MB "
                f"decoded, " + fit.format(self.cache_mb))

    def _windows(self, epoch: int) -> list[tuple[int, int, int]]:
        """(episode, first frame, count), shuffled per epoch."""
        if self._memo is not None and self._memo[0] == ("windows", epoch):
            return self._memo[1]
        wins = [(ep.episode_index, first, min(self.window, ep.length - self.drop_last - first))
                for ep in self.ds.meta.episodes if self.episodes is None or ep.episode_index in self.episodes
                for first in range(0, ep.length - self.drop_last, self.window)]
        random.Random(self.seed * 1_000_003 + epoch).shuffle(wins)
        self._memo = (("windows", epoch), wins)
        return wins

    def _permutation(self, epoch: int) -> np.ndarray:
        """Every frame key of the split (drop_last frames excepted) in this epoch's seeded order."""
        if self._memo is not None and self._memo[0] == ("uniform", epoch):
            return self._memo[1]
        keys = np.concatenate([np.arange(self.ds.ep_from[ep.episode_index],
                                         self.ds.ep_from[ep.episode_index] + ep.length - self.drop_last)
                               for ep in self.ds.meta.episodes
                               if self.episodes is None or ep.episode_index in self.episodes])
        perm = np.random.default_rng([self.seed, epoch, 0x5A3D]).permutation(keys)  # int64: 8 bytes a frame
        self._memo = (("uniform", epoch), perm)
        return perm

    def order_record(self) -> dict:
        """What the run record says about the order samples are drawn in."""
        if self.order == "uniform":
            return {"sample_order": "uniform"}
        return {"sample_order": "windows", "window": self.window, "shuffle_buffer": self.shuffle_buffer}

    def order_line(self) -> str:
        if self.order == "uniform":
            frames = len(self._permutation(self.epoch))  # the same every epoch; the memoised one, not a new one
            return (f"sample order: uniform, a new permutation of the split's {frames} frames "
                    "every epoch (as LeRobot's shuffled DataLoader)")
        return (f"sample order: windows of {self.window} consecutive frames mixed in a {self.shuffle_buffer}-frame "
                "shuffle buffer (video decoded sequentially)")

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "buffer": list(self.buffer),
                "rng": self.rng.getstate(), "order": self.order}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self.buffer = list(state["buffer"])
        rng = state["rng"]
        self.rng.setstate((rng[0], tuple(rng[1]), rng[2]))
        # a run continues in the order it began with (checkpoints from before orders had names: windows)
        self.order = str(state.get("order", "windows"))

    def next_key(self) -> int:
        if self.order == "uniform":
            perm = self._permutation(self.epoch)
            while self.cursor >= len(perm):
                self.epoch, self.cursor = self.epoch + 1, 0
                perm = self._permutation(self.epoch)
            self.cursor += 1
            return int(perm[self.cursor - 1])
        while len(self.buffer) < self.shuffle_buffer:
            wins = self._windows(self.epoch)
            if self.cursor >= len(wins):
                self.epoch, self.cursor = self.epoch + 1, 0
                continue
            ep, first, count = wins[self.cursor]
            self.cursor += 1
            start = self.ds.ep_from[ep] + first
            self.buffer.extend(range(start, start + count))
        k = self.rng.randrange(len(self.buffer))
        self.buffer[k], self.buffer[-1] = self.buffer[-1], self.buffer[k]
        return self.buffer.pop()

    def num_tokens(self, key: int, tokens_per_image: int) -> int:
        """Backbone tokens of a key's sample, known without decoding anything."""
        num_cams = len(self.cams) if self.with_video else 0
        return num_cams * tokens_per_image + len(self._tokens[int(self.ds.task_index[key])]) + self.state_tokens

    def num_valid_steps(self, key: int) -> int:
        return int((~self.ds.action_chunk(key)[1]).sum())

    def _window_of(self, key: int) -> tuple[int, int, int]:
        ep = int(self.ds.episode_index[key])
        first = (int(self.ds.frame_index[key]) // self.window) * self.window
        length = self.ds.ep_to[ep] - self.ds.ep_from[ep]
        return ep, first, min(self.window, length - first)

    def prefetch(self, keys: list[int]) -> None:
        """Start decoding the windows these keys need (no-op for cached ones)."""
        if not self.with_video:
            return
        for key in keys:
            ep, first, count = self._window_of(key)
            if (ep, first) in self._cache:
                self._cache.move_to_end((ep, first))
                continue
            self._cache[(ep, first)] = self._pool.submit(self._decode, ep, first, count)
            while len(self._cache) > self._cache_windows:
                self._cache.popitem(last=False)

    def _decode(self, ep: int, first: int, count: int) -> tuple[int, dict[str, np.ndarray]]:
        """The window's frames, and the history frames before it: (the first frame decoded, frames)."""
        lo = max(0, first - (self.history - 1))
        return lo, {k: self.ds.decode_window(ep, k, lo, count + first - lo, self.image_size) for k in self.cams}

    def materialize(self, keys: list[int]) -> list[Sample]:
        self.prefetch(keys)
        return [self._sample(k) for k in keys]

    def _sample(self, key: int) -> Sample:
        ds = self.ds
        images = []
        h, t = self.history, int(ds.frame_index[key])
        steps = [max(0, t - back) for back in range(h - 1, -1, -1)]  # oldest first, clamped to the first frame
        if self.with_video:
            ep, first, _ = self._window_of(key)
            lo, frames = self._cache[(ep, first)].result()
            images = [cams.to_training_input(frames[k][[s - lo for s in steps]], self.depth_mm.get(k))
                      .reshape(-1, *frames[k].shape[1:3]) if h > 1 else
                      cams.to_training_input(frames[k][t - lo:t - lo + 1], self.depth_mm.get(k))[0] for k in self.cams]
        actions, pad = ds.action_chunk(key, start=1 - h)
        state = ds.state[key]
        hist = torch.from_numpy(np.ascontiguousarray(ds.state[[key - t + s for s in steps]], dtype=np.float32)) \
            if h > 1 else None
        aux = ds.aux[key] if ds.aux is not None else None
        env = None
        if ds.env_state is not None and self.env_state:  # raw: the family normalises what it reads
            env = ds.env_state[[key - t + s for s in steps]] if h > 1 else ds.env_state[key]
            env = torch.from_numpy(np.ascontiguousarray(env, dtype=np.float32))
        if self.norm is not None:
            actions, state = self.norm(ds.action_key, actions), self.norm(ds.state_key, state)
            if aux is not None and ds.aux_key in self.norm.mean:
                aux = self.norm(ds.aux_key, aux)
        return Sample(images=images, instruction=self._tokens[int(ds.task_index[key])],
                      state=torch.from_numpy(np.ascontiguousarray(state, dtype=np.float32)),
                      actions=torch.from_numpy(np.ascontiguousarray(actions, dtype=np.float32)),
                      action_mask=torch.from_numpy(~pad),
                      aux=None if aux is None else torch.from_numpy(np.ascontiguousarray(aux, dtype=np.float32)),
                      state_hist=hist, env_state=env)

    def __iter__(self) -> Iterator[Sample]:
        while True:
            yield self.materialize([self.next_key()])[0]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
