"""Synthetic LeRobot datasets with real mp4 video, for tests, benchmarks and the demo.

Each episode is a smooth joint-space trajectory (state) with action = the next state, an
instruction drawn from a small set, and cameras that render a scene depending on the
frame: a gradient background and a square whose position follows the trajectory, plus
optional noise to reach realistic bitrates. Everything is a function of (seed, episode,
frame), so two runs write identical datasets.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from roboloop import fsutil
from roboloop.datasets import layout, stats, video
from roboloop.datasets.config import DEFAULT_TASKS, GenSpec  # noqa: F401  (re-exported)


def _lengths(spec: GenSpec) -> np.ndarray:
    rng = np.random.default_rng(spec.seed)
    return rng.integers(spec.min_length, spec.max_length + 1, size=spec.num_episodes)


def trajectory(spec: GenSpec, episode: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(state, action) for one episode: action[t] = state[t + 1] (the last repeats)."""
    rng = np.random.default_rng([spec.seed, episode])
    t = np.arange(length + 1)[:, None] / spec.fps
    freq = rng.uniform(0.2, 1.0, size=(1, spec.state_dim))
    phase = rng.uniform(0, 2 * np.pi, size=(1, spec.state_dim))
    amp = rng.uniform(0.2, 1.0, size=(1, spec.state_dim))
    full = (amp * np.sin(2 * np.pi * freq * t + phase)).astype(np.float32)
    state = full[:-1]
    action = np.resize(full[1:], (length, spec.action_dim)).astype(np.float32)
    return state, action


def render(spec: GenSpec, episode: int, cam: int, state: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """Frames (T, H, W, 3) uint8 for one camera of one episode."""
    h, w = hw
    length = len(state)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.empty((h, w, 3), dtype=np.float32)
    base[..., 0] = 40 + 120 * xx / max(w - 1, 1)
    base[..., 1] = 40 + 120 * yy / max(h - 1, 1)
    base[..., 2] = 60 + 40 * ((episode * 7 + cam * 13) % 5)
    frames = np.empty((length, h, w, 3), dtype=np.uint8)
    side = max(4, min(h, w) // 5)
    rng = np.random.default_rng([spec.seed, episode, cam, 7])
    # A small bank of noise fields, cycled: realistic bitrates without a random draw per pixel per frame.
    bank = [rng.integers(-spec.noise, spec.noise + 1, size=(h, w, 3)).astype(np.float32)
            for _ in range(min(length, 7))] if spec.noise else []
    for i in range(length):
        img = base.copy()
        cy = int((state[i, 0] * 0.5 + 0.5) * (h - side))
        cx = int((state[i, 1 % state.shape[1]] * 0.5 + 0.5) * (w - side))
        img[cy : cy + side, cx : cx + side] = (230, 60 + 30 * cam, 40)
        if bank:
            img += bank[i % len(bank)]
        frames[i] = np.clip(img, 0, 255).astype(np.uint8)
    return frames


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _arrow_column(values: np.ndarray) -> pa.Array:
    if values.ndim == 1:
        return pa.array(values)
    flat = pa.array(values.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])


def _write_episode(root: Path, spec: GenSpec, episode: int, length: int, start: int, task_index: int) -> dict:
    """Write one v2.1 episode (parquet + mp4s); return its episodes_stats row."""
    state, action = trajectory(spec, episode, length)
    chunk = layout.chunk_of(episode, spec.chunks_size)
    cols: dict[str, np.ndarray] = {
        "observation.state": state,
        "action": action,
        "timestamp": (np.arange(length) / spec.fps).astype(np.float32),
        "frame_index": np.arange(length, dtype=np.int64),
        "episode_index": np.full(length, episode, dtype=np.int64),
        "index": np.arange(start, start + length, dtype=np.int64),
        "task_index": np.full(length, task_index, dtype=np.int64),
    }
    ep_stats = {k: stats.vector_stats(v, with_quantiles=False) for k, v in cols.items()}
    arrays = {k: _arrow_column(v) for k, v in cols.items()}
    for j, (key, hw) in enumerate(spec.image_keys.items()):
        frames = render(spec, episode, 100 + j, state, hw)
        structs = [{"bytes": _png(f), "path": None} for f in frames]
        arrays[key] = pa.array(structs, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
        ep_stats[key] = stats.image_stats(frames[stats.sample_indices(length)])
    order = ["observation.state", "action", *spec.image_keys, *layout.INDEX_COLUMNS]
    table = pa.table({k: arrays[k] for k in order})
    data_path = root / layout.V21_DATA_PATH.format(episode_chunk=chunk, episode_index=episode)
    data_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, data_path)
    for cam, (key, hw) in enumerate(spec.cameras.items()):
        frames = render(spec, episode, cam, state, hw)
        path = root / layout.V21_VIDEO_PATH.format(episode_chunk=chunk, video_key=key, episode_index=episode)
        video.encode_frames(frames, path, spec.fps, codec=spec.codec, crf=spec.crf)
        ep_stats[key] = stats.image_stats(frames[stats.sample_indices(length)])
    return {"episode_index": episode, "stats": stats.to_jsonable(ep_stats)}


def _features(spec: GenSpec) -> dict:
    feats: dict[str, dict] = {}
    for key, (h, w) in spec.cameras.items():
        feats[key] = {
            "dtype": "video",
            "shape": [h, w, 3],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": h,
                "video.width": w,
                "video.codec": "h264" if spec.codec == "libx264" else "av1",
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": _fps_json(spec.fps),
                "video.channels": 3,
                "has_audio": False,
            },
        }
    for key, (h, w) in spec.image_keys.items():
        feats[key] = {"dtype": "image", "shape": [h, w, 3], "names": ["height", "width", "channels"]}
    feats["observation.state"] = {
        "dtype": "float32",
        "shape": [spec.state_dim],
        "names": [f"joint_{i}" for i in range(spec.state_dim)],
    }
    feats["action"] = {
        "dtype": "float32",
        "shape": [spec.action_dim],
        "names": [f"joint_{i}" for i in range(spec.action_dim)],
    }
    feats["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for key in ("frame_index", "episode_index", "index", "task_index"):
        feats[key] = {"dtype": "int64", "shape": [1], "names": None}
    return feats


def generate_v21(root: str | Path, spec: GenSpec | None = None, workers: int | None = None) -> Path:
    """Write a LeRobot v2.1 dataset at `root` (atomically: temp folder, then rename)."""
    spec = spec or GenSpec()
    root = Path(root)
    if root.exists():
        raise FileExistsError(f"{root} already exists")
    root.parent.mkdir(parents=True, exist_ok=True)
    fsutil.sweep_temps(root)
    tmp = fsutil.make_dir(fsutil.temp_sibling(root))  # umask permissions; swept if we die
    try:
        lengths = _lengths(spec)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        task_of = [e % len(spec.tasks) for e in range(spec.num_episodes)]
        workers = workers or min(os.cpu_count() or 1, 8)
        args = [(tmp, spec, e, int(lengths[e]), int(starts[e]), task_of[e]) for e in range(spec.num_episodes)]
        if workers > 1 and spec.num_episodes > 1:
            # forkserver: workers never fork the caller, whose threads (a server, onnxruntime, a Prefect
            # worker) may hold locks a forked child would wait on forever
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver")) as pool:
                stats_rows = list(pool.map(_write_episode_star, args, chunksize=4))
        else:
            stats_rows = [_write_episode(*a) for a in args]
        meta = tmp / "meta"
        meta.mkdir(parents=True, exist_ok=True)
        used = sorted(set(task_of))
        _write_jsonl(meta / "tasks.jsonl", [{"task_index": i, "task": spec.tasks[i]} for i in used])
        _write_jsonl(
            meta / "episodes.jsonl",
            [
                {"episode_index": e, "tasks": [spec.tasks[task_of[e]]], "length": int(lengths[e])}
                for e in range(spec.num_episodes)
            ],
        )
        _write_jsonl(meta / "episodes_stats.jsonl", stats_rows)
        info = {
            "codebase_version": layout.V21,
            "robot_type": spec.robot_type,
            "total_episodes": spec.num_episodes,
            "total_frames": int(lengths.sum()),
            "total_tasks": len(used),
            "total_videos": spec.num_episodes * len(spec.cameras),
            "total_chunks": layout.chunk_of(spec.num_episodes - 1, spec.chunks_size) + 1,
            "chunks_size": spec.chunks_size,
            "fps": _fps_json(spec.fps),
            "splits": {"train": f"0:{spec.num_episodes}"},
            "data_path": layout.V21_DATA_PATH,
            "video_path": layout.V21_VIDEO_PATH if spec.cameras else None,
            "features": _features(spec),
        }
        (meta / "info.json").write_text(json.dumps(info, indent=4))
        tmp.rename(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def _fps_json(fps: float) -> int | float:
    return int(fps) if float(fps).is_integer() else fps


def _write_episode_star(args: tuple) -> dict:
    return _write_episode(*args)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
