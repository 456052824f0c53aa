"""Recorded episodes -> LeRobot datasets: expert collection (v2.1, the demo's raw data) and
evaluation rollouts (v3, feeding the next round of training)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from roboloop.datasets.writer import EpisodeWriterV21


def write_v21(trajectories: list[dict], dst: str | Path, fps: int, robot_type: str = "roboloop",
              state_names: list[str] | None = None, action_names: list[str] | None = None,
              env_state_names: list[str] | None = None) -> Path:
    """Trajectories ({states, actions, images, task[, env_state]}) as a v2.1 dataset; `env_state` (the simulator's
    privileged state) becomes observation.environment_state."""
    if not trajectories:
        raise ValueError("no episodes to write")
    first = trajectories[0]
    s_dim, a_dim = len(first["states"][0]), len(first["actions"][0])
    cams = {k: tuple(np.asarray(v[0]).shape[:2]) for k, v in first["images"].items()}
    env_dim = len(first["env_state"][0]) if first.get("env_state") else 0
    w = EpisodeWriterV21(dst, fps, state_names or [f"s{i}" for i in range(s_dim)],
                         action_names or [f"a{i}" for i in range(a_dim)], cams, robot_type=robot_type,  # type: ignore[arg-type]
                         env_state_names=(env_state_names or [f"e{i}" for i in range(env_dim)]) if env_dim else None)
    with w:
        for t in trajectories:
            w.add_episode(np.stack(t["states"]), np.stack(t["actions"]),
                          {k: np.stack(v) for k, v in t["images"].items()}, t["task"],
                          env_state=np.stack(t["env_state"]) if env_dim else None)
        return w.close()


def write_v3(trajectories: list[dict], dst: str | Path, fps: int, **kw) -> Path:
    """Rollouts as a v3.0 dataset (written as v2.1 in a temp folder, then converted)."""
    from roboloop.datasets.convert import ConvertConfig, convert

    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dst.name}.", dir=dst.parent) as tmp:
        src = write_v21(trajectories, Path(tmp) / "v21", fps, **kw)
        convert(src, dst, ConvertConfig(progress=False))
        shutil.rmtree(src, ignore_errors=True)
    return dst
