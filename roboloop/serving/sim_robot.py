"""A simulator behind LeRobot's robot interface, so `roboloop robot` is tested (and rehearsed) before an arm is
plugged in: `observation_features`, `action_features`, `get_observation()` and `send_action()` over one env of a
roboloop task (the SO-101 pick-cube reports `shoulder_pan.pos` ... `gripper.pos` and cameras `front`, `wrist`,
exactly as LeRobot's `so101_follower` does)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def _names(task: str, state_dim: int, action_dim: int) -> tuple[list[str], list[str]]:
    """The task's own state and action names where they fit (LeRobot's so101_follower motors on the SO-101), else
    numbered."""
    from roboloop.sim.registry import task as task_spec

    spec = task_spec(task)
    return spec.names("state", state_dim), spec.names("action", action_dim)


class SimRobot:
    name = "sim"

    def __init__(self, env: Any, seed: int = 0):
        """`env`: a roboloop BatchedEnv with one env (`SimRobot.make(task)` builds one)."""
        if env.num_envs != 1:
            raise ValueError(f"a simulated robot is one env, not {env.num_envs}")
        self.env, self.task, self.seed = env, env.task, seed
        self.obs = self.env.reset(seed=seed)
        self.state_names, self.action_names = _names(self.task, self.obs.state.shape[1], self.env.action_dim)
        self.cams = {k.removeprefix("observation.images."): k for k in self.obs.images}
        self.episodes: list[dict] = []  # each finished episode: success, return, length
        self.episode_ended = False
        self._ret, self._len = 0.0, 0

    @classmethod
    def make(cls, task: str, seed: int = 0, device: str = "cpu") -> SimRobot:
        from roboloop.sim import make_env

        return cls(make_env(task, 1, device, seed), seed)

    @property
    def observation_features(self) -> dict[str, Any]:
        feats: dict[str, Any] = dict.fromkeys(self.state_names, float)
        for cam, key in self.cams.items():
            feats[cam] = tuple(self.obs.images[key].shape[1:])
        return feats

    @property
    def action_features(self) -> dict[str, type]:
        return dict.fromkeys(self.action_names, float)

    def joint_limits(self) -> dict[str, tuple[float, float, str]]:
        """The task's action bounds as the envelope's limits: joints named `*.pos` (the SO-101's, LeRobot's schema)
        in degrees, except its gripper (percent); other tasks' actions in their own units."""
        from roboloop.serving.envelope import task_units

        low, high = self.env.action_low.tolist(), self.env.action_high.tolist()
        return {n: (lo, hi, task_units(n)) for n, lo, hi in zip(self.action_names, low, high, strict=True)}

    def get_observation(self) -> dict[str, Any]:
        s = self.obs.state[0].cpu().numpy()
        out: dict[str, Any] = {k: float(v) for k, v in zip(self.state_names, s, strict=True)}
        for cam, key in self.cams.items():
            out[cam] = self.obs.images[key][0].cpu().numpy()
        return out

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        a = torch.tensor([[float(action[k]) for k in self.action_names]], dtype=torch.float32)
        a = torch.maximum(torch.minimum(a, self.env.action_high), self.env.action_low)  # as the Evaluator does
        r = self.env.step(a)
        self.obs = r.obs
        self.episode_ended = bool(r.done[0])
        self._ret += float(r.reward[0])
        self._len += 1
        if self.episode_ended:
            self.episodes.append({"success": bool(r.success[0]), "ret": self._ret, "length": self._len})
            self._ret, self._len = 0.0, 0
        return {k: float(v) for k, v in zip(self.action_names, np.asarray(a[0]), strict=True)}

    def disconnect(self) -> None:
        self.env.close()
