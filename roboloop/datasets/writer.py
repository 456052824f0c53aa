"""Write recorded episodes (collection, evaluation rollouts) as a LeRobot v2.1 dataset.

Episodes are written as they finish (parquet + one mp4 per camera) into a temporary folder
next to the destination; `close()` writes meta/ and renames it into place, so an
interrupted recording leaves nothing that looks like a dataset. `to_v3()` converts the
result with roboloop's converter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from roboloop import fsutil
from roboloop.datasets import layout, stats, video
from roboloop.datasets.generate import _arrow_column, _write_jsonl

ENV_STATE = layout.ENV_STATE  # the scene's state (in roboloop's tasks privileged: what the simulator knows)


class EpisodeWriterV21:
    def __init__(self, root: str | Path, fps: int, state_names: list[str], action_names: list[str],
                 cameras: dict[str, tuple[int, int]], robot_type: str = "roboloop", chunks_size: int = 1000,
                 crf: int = 23, env_state_names: list[str] | None = None):
        self.root = Path(root)
        if self.root.exists():
            raise FileExistsError(f"{self.root} already exists")
        self.root.parent.mkdir(parents=True, exist_ok=True)
        fsutil.sweep_temps(self.root)
        self.tmp = fsutil.make_dir(fsutil.temp_sibling(self.root))  # umask permissions; swept if we die
        self.fps, self.cameras, self.robot_type = fps, dict(cameras), robot_type
        self.state_names, self.action_names, self.chunks_size, self.crf = state_names, action_names, chunks_size, crf
        self.env_state_names = env_state_names  # observation.environment_state (privileged sim state), if recorded
        self.tasks: dict[str, int] = {}
        self.episodes: list[dict] = []
        self.stats_rows: list[dict] = []
        self.frames = 0

    def add_episode(self, states: np.ndarray, actions: np.ndarray, images: dict[str, np.ndarray], task: str,
                    env_state: np.ndarray | None = None) -> int:
        """states (T, S), actions (T, A), images {camera: (T, H, W, 3) uint8}, env_state (T, E) if the writer
        declares env_state_names; returns the episode index."""
        ep, length = len(self.episodes), len(states)
        if length == 0 or len(actions) != length or any(len(v) != length for v in images.values()):
            raise ValueError(f"episode {ep}: states, actions and frames must have the same non-zero length")
        want = None if self.env_state_names is None else (length, len(self.env_state_names))
        if (None if env_state is None else np.shape(env_state)) != want:
            raise ValueError(f"episode {ep}: observation.environment_state must be ({length}, "
                             f"{len(self.env_state_names or [])}) when declared, and absent otherwise")
        if set(images) != set(self.cameras):
            raise ValueError(f"episode {ep}: cameras {sorted(images)} != declared {sorted(self.cameras)}")
        task_index = self.tasks.setdefault(task, len(self.tasks))
        chunk = layout.chunk_of(ep, self.chunks_size)
        cols: dict[str, np.ndarray] = {
            "observation.state": np.asarray(states, dtype=np.float32),
            "action": np.asarray(actions, dtype=np.float32),
            **({ENV_STATE: np.asarray(env_state, dtype=np.float32)} if env_state is not None else {}),
            "timestamp": (np.arange(length) / self.fps).astype(np.float32),
            "frame_index": np.arange(length, dtype=np.int64),
            "episode_index": np.full(length, ep, dtype=np.int64),
            "index": np.arange(self.frames, self.frames + length, dtype=np.int64),
            "task_index": np.full(length, task_index, dtype=np.int64),
        }
        ep_stats = {k: stats.vector_stats(v, with_quantiles=False) for k, v in cols.items()}
        data_path = self.tmp / layout.V21_DATA_PATH.format(episode_chunk=chunk, episode_index=ep)
        data_path.parent.mkdir(parents=True, exist_ok=True)
        # LeRobot stores shape-[1] features as scalars, longer ones as fixed-size lists
        pq.write_table(pa.table({k: _arrow_column(v[:, 0] if v.ndim == 2 and v.shape[1] == 1 else v)
                                 for k, v in cols.items()}), data_path)
        for key, frames in images.items():
            path = self.tmp / layout.V21_VIDEO_PATH.format(episode_chunk=chunk, video_key=key, episode_index=ep)
            video.encode_frames(frames, path, self.fps, crf=self.crf)
            ep_stats[key] = stats.image_stats(frames[stats.sample_indices(length)])
        self.stats_rows.append({"episode_index": ep, "stats": stats.to_jsonable(ep_stats)})
        self.episodes.append({"episode_index": ep, "tasks": [task], "length": length})
        self.frames += length
        return ep

    def _features(self) -> dict:
        feats: dict[str, dict] = {}
        for key, (h, w) in self.cameras.items():
            feats[key] = {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
                          "info": {"video.height": h, "video.width": w, "video.codec": "h264",
                                   "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": self.fps,
                                   "video.channels": 3, "has_audio": False}}
        feats["observation.state"] = {"dtype": "float32", "shape": [len(self.state_names)],
                                      "names": list(self.state_names)}
        feats["action"] = {"dtype": "float32", "shape": [len(self.action_names)], "names": list(self.action_names)}
        if self.env_state_names is not None:
            feats[ENV_STATE] = {"dtype": "float32", "shape": [len(self.env_state_names)],
                                "names": list(self.env_state_names)}
        feats["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
        for key in ("frame_index", "episode_index", "index", "task_index"):
            feats[key] = {"dtype": "int64", "shape": [1], "names": None}
        return feats

    def close(self) -> Path:
        if not self.episodes:
            self.abort()
            raise ValueError("no episodes recorded; nothing written")
        n = len(self.episodes)
        meta = self.tmp / "meta"
        meta.mkdir(parents=True, exist_ok=True)
        _write_jsonl(meta / "tasks.jsonl", [{"task_index": i, "task": t} for t, i in self.tasks.items()])
        _write_jsonl(meta / "episodes.jsonl", self.episodes)
        _write_jsonl(meta / "episodes_stats.jsonl", self.stats_rows)
        info = {"codebase_version": layout.V21, "robot_type": self.robot_type, "total_episodes": n,
                "total_frames": self.frames, "total_tasks": len(self.tasks), "total_videos": n * len(self.cameras),
                "total_chunks": layout.chunk_of(n - 1, self.chunks_size) + 1, "chunks_size": self.chunks_size,
                "fps": self.fps, "splits": {"train": f"0:{n}"}, "data_path": layout.V21_DATA_PATH,
                "video_path": layout.V21_VIDEO_PATH if self.cameras else None, "features": self._features()}
        (meta / "info.json").write_text(json.dumps(info, indent=4))
        self.tmp.rename(self.root)
        return self.root

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> EpisodeWriterV21:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
