"""Gymnasium vector-env backend (e.g. gym-pusht, LeRobot's standard CPU evaluation env).

Uses gymnasium's same-step auto-reset: when an env finishes, `step` returns its next
episode's first observation and the finished episode's info under `final_info`. Success is
`info["is_success"]` (gym-pusht, gym-aloha, metaworld-style) or `info["success"]`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from roboloop.evaluation.protocol import Obs, StepResult

KNOWN: dict[str, dict[str, Any]] = {
    "gym_pusht/PushT-v0": {"module": "gym_pusht", "kwargs": {"obs_type": "pixels_agent_pos"},
                           "instruction": "Push the T-shaped block onto the T-shaped target."},
}


class GymVectorEnv:
    def __init__(self, task: str, num_envs: int = 8, seed: int = 0, instruction: str | None = None,
                 **make_kwargs):
        import importlib

        import gymnasium as gym

        spec = KNOWN.get(task, {})
        if "module" in spec:
            try:
                importlib.import_module(spec["module"])
            except ImportError as e:
                raise ImportError(f"{task} needs the {spec['module']} package (pip install gym-pusht --no-deps "
                                  "pymunk pygame)") from e
        kwargs = {**spec.get("kwargs", {}), **make_kwargs}
        self.env = gym.make_vec(task, num_envs=num_envs, vectorization_mode="sync",
                                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **kwargs)
        self.task, self.num_envs, self.seed = task, num_envs, seed
        self.instruction = instruction if instruction is not None else spec.get("instruction", "")
        space: Any = self.env.single_action_space
        self.action_dim = int(np.prod(space.shape))
        self.action_low = torch.as_tensor(space.low, dtype=torch.float32).reshape(-1)
        self.action_high = torch.as_tensor(space.high, dtype=torch.float32).reshape(-1)
        self.fps = int(self.env.metadata.get("render_fps", 10))
        self.backend = "gymnasium"

    def _obs(self, raw) -> Obs:
        images: dict[str, torch.Tensor] = {}
        if isinstance(raw, dict):
            parts = []
            for k, v in raw.items():
                v = np.asarray(v)
                if v.ndim == 4 and v.shape[-1] == 3:
                    images["observation.image" if k == "pixels" else f"observation.images.{k}"] = \
                        torch.from_numpy(v.astype(np.uint8))
                else:
                    parts.append(v.reshape(self.num_envs, -1))
            state = np.concatenate(parts, axis=1) if parts else np.zeros((self.num_envs, 0))
        else:
            state = np.asarray(raw).reshape(self.num_envs, -1)
        return Obs(torch.from_numpy(state.astype(np.float32)), images, [self.instruction] * self.num_envs)

    def reset(self, seed: int | None = None) -> Obs:
        raw, _ = self.env.reset(seed=self.seed if seed is None else seed)
        return self._obs(raw)

    def step(self, actions: torch.Tensor) -> StepResult:
        raw, rew, term, trunc, info = self.env.step(actions.cpu().numpy().reshape(self.num_envs, -1))
        done = np.logical_or(term, trunc)
        success = np.zeros(self.num_envs, dtype=bool)
        final = info.get("final_info", info)
        for key in ("is_success", "success"):
            if key in final:
                mask = final.get(f"_{key}", np.ones(self.num_envs, dtype=bool))
                success = np.asarray(final[key], dtype=bool) & np.asarray(mask, dtype=bool)
                break
        return StepResult(self._obs(raw), torch.as_tensor(np.asarray(rew, dtype=np.float32)),
                          torch.from_numpy(done), torch.from_numpy(success & done))

    def expert(self, obs: Obs) -> torch.Tensor | None:
        return None

    def close(self) -> None:
        self.env.close()

    def __enter__(self) -> GymVectorEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_env(task: str, num_envs: int, device: str = "cpu", seed: int = 0, camera: bool = True,
             overrides: dict | None = None):
    """Isaac Lab for `Isaac-*` and `Roboloop-*` tasks, gymnasium for everything else.

    An unknown task is an `UnknownTaskError` listing the known ones (not gymnasium's NameNotFound)."""
    from roboloop.errors import UnknownTaskError
    from roboloop.evaluation.config import ROBOLOOP_TASKS, unknown_task_message

    if task.startswith("Roboloop-") and task not in ROBOLOOP_TASKS:
        raise UnknownTaskError(unknown_task_message(task))
    try:
        if task.startswith(("Isaac-", "Roboloop-")):
            from roboloop.evaluation.isaac import IsaacLabEnv

            return IsaacLabEnv(task, num_envs=num_envs, device=device, seed=seed, camera=camera, overrides=overrides)
        return GymVectorEnv(task, num_envs=num_envs, seed=seed)
    except Exception as e:
        if type(e).__module__.startswith("gymnasium") and "NotFound" in type(e).__name__ \
                or isinstance(e, ValueError) and "not found" in str(e).lower() and task in str(e):
            raise UnknownTaskError(unknown_task_message(task)) from e
        raise
