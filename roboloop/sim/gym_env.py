"""Gymnasium vector-env backend (e.g. gym-pusht, LeRobot's standard CPU evaluation env).

`lerobot:<env type>` (e.g. `lerobot:pusht`) takes the environment from LeRobot's own env configs (or a
`lerobot_env_*` plugin registered with them): its gym id, its kwargs and its `features_map`, which names
each raw observation key as the policy's feature (`pixels` -> `observation.image`, `agent_pos` ->
`observation.state`); `observation.environment_state` is kept out of the state and given to the policies that
read it. Options of the env config follow a `?`: `lerobot:pusht?obs_type=environment_state_agent_pos` observes
PushT's keypoints instead of pixels (LeRobot's PushT-keypoints setting).

Uses gymnasium's same-step auto-reset: when an env finishes, `step` returns its next
episode's first observation and the finished episode's info under `final_info`. Success is
`info["is_success"]` (gym-pusht, gym-aloha, metaworld-style) or `info["success"]`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from roboloop.sim.protocol import Obs, StepResult


def lerobot_spec(task: str, env_type_query: str) -> dict[str, Any]:
    """The spec of `lerobot:<env type>` from LeRobot's env config of that type."""
    from lerobot.envs.configs import EnvConfig

    from roboloop.errors import UnknownTaskError

    env_type, _, query = env_type_query.partition("?")
    try:
        choice = EnvConfig.get_choice_class(env_type)
    except Exception as e:  # draccus: an unregistered choice
        raise UnknownTaskError(f"unknown LeRobot environment {env_type!r}: LeRobot's env configs have "
                               f"{', '.join(sorted(EnvConfig.get_known_choices()))}") from e
    options: dict[str, Any] = {}
    fields = choice.__dataclass_fields__
    for pair in filter(None, query.split("&")):
        name, eq, value = pair.partition("=")
        if not eq or name not in fields or name in ("features", "features_map"):
            raise UnknownTaskError(f"{task}: {pair!r} is not an option of LeRobot's {choice.__name__} (it has "
                                   f"{', '.join(k for k in fields if k not in ('features', 'features_map'))})")
        options[name] = int(value) if value.lstrip("-").isdigit() else value
    cfg = choice(**options)
    return {"gym_id": cfg.gym_id, "module": cfg.package_name, "kwargs": dict(cfg.gym_kwargs),
            "features_map": dict(cfg.features_map), "fps": cfg.fps, "instruction": ""}


class GymVectorEnv:
    def __init__(self, task: str, num_envs: int = 8, seed: int = 0, instruction: str | None = None,
                 **make_kwargs):
        import importlib

        import gymnasium as gym

        from roboloop.sim.registry import task as task_spec

        options = dict(task_spec(task).options)
        spec = lerobot_spec(task, options["lerobot_env"]) if "lerobot_env" in options else options
        self.features_map: dict[str, str] = spec.get("features_map", {})
        if "module" in spec:
            try:
                importlib.import_module(spec["module"])
            except ImportError as e:
                raise ImportError(f"{task} needs the {spec['module']} package (pip install gym-pusht --no-deps "
                                  "pymunk pygame)") from e
        kwargs = {**spec.get("kwargs", {}), **make_kwargs}
        self.env = gym.make_vec(spec.get("gym_id", task), num_envs=num_envs, vectorization_mode="sync",
                                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **kwargs)
        self.task, self.num_envs, self.seed = task, num_envs, seed
        self.instruction = instruction if instruction is not None else spec.get("instruction", "")
        space: Any = self.env.single_action_space
        self.action_dim = int(np.prod(space.shape))
        self.action_low = torch.as_tensor(space.low, dtype=torch.float32).reshape(-1)
        self.action_high = torch.as_tensor(space.high, dtype=torch.float32).reshape(-1)
        self.fps = int(spec.get("fps") or self.env.metadata.get("render_fps", 10))
        self.backend = "gymnasium"

    def _obs(self, raw) -> Obs:
        images: dict[str, torch.Tensor] = {}
        env_state = None
        if isinstance(raw, dict):
            parts = []
            for k, v in raw.items():
                v = np.asarray(v)
                name = self.features_map.get(k)
                if v.ndim == 4 and v.shape[-1] == 3:
                    images[name or ("observation.image" if k == "pixels" else f"observation.images.{k}")] = \
                        torch.from_numpy(v.astype(np.uint8))
                elif name == "observation.environment_state":  # the scene's state: its own input, never the state
                    env_state = torch.from_numpy(v.reshape(self.num_envs, -1).astype(np.float32))
                else:
                    parts.append(v.reshape(self.num_envs, -1))
            state = np.concatenate(parts, axis=1) if parts else np.zeros((self.num_envs, 0))
        else:
            state = np.asarray(raw).reshape(self.num_envs, -1)
        return Obs(torch.from_numpy(state.astype(np.float32)), images, [self.instruction] * self.num_envs,
                   env_state)

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


def make(spec, num_envs: int, device: str, seed: int, camera: bool, overrides: dict):
    """A gymnasium task's vector env (the registry's factory). An id gymnasium does not know is an
    `UnknownTaskError` listing the known ones (not gymnasium's NameNotFound)."""
    from roboloop.errors import UnknownTaskError
    from roboloop.sim.registry import unknown_task_message

    try:
        return GymVectorEnv(spec.id, num_envs=num_envs, seed=seed)
    except Exception as e:
        if type(e).__module__.startswith("gymnasium") and "NotFound" in type(e).__name__ \
                or isinstance(e, ValueError) and "not found" in str(e).lower() and spec.id in str(e):
            raise UnknownTaskError(unknown_task_message(spec.id)) from e
        raise
