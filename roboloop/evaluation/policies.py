"""Policies the Evaluator runs: random, the task's scripted expert, and a trained model of any family
(`roboloop.policies`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from roboloop.errors import ModelMismatchError
from roboloop.sim.protocol import BatchedEnv, Obs, row_generator


class RandomPolicy:
    name = "random"

    def __init__(self, env: BatchedEnv, seed: int = 0):
        self.low, self.high, self.seed = env.action_low, env.action_high, seed
        self.g = torch.Generator().manual_seed(seed)

    def act(self, obs: Obs) -> torch.Tensor:
        a = self.low.shape[0]
        if obs.keys is not None:  # per (episode, step): the same actions whatever the batching
            u = torch.stack([torch.rand(a, generator=row_generator(self.seed, k)) for k in obs.keys])
        else:
            u = torch.rand(obs.state.shape[0], a, generator=self.g)
        return self.low + u * (self.high - self.low)


class ExpertPolicy:
    name = "expert"
    whole_batch = True  # it reads the simulator: asked for every env at once, its rows for the envs that need one

    def __init__(self, env: BatchedEnv):
        self.env = env

    def act(self, obs: Obs) -> torch.Tensor:
        a = self.env.expert(obs)
        if a is None:
            raise ValueError(f"task {self.env.task} has no scripted expert")
        return a


class NoisyPolicy:
    """DART-style perturbations: the wrapped policy's action plus Gaussian noise, held for a few steps, so the
    recorded states include the drift a learned policy will produce (labels come from the clean expert)."""

    def __init__(self, inner, sigma: float, seed: int = 0, hold: int = 4, low: torch.Tensor | float = -1.0,
                 high: torch.Tensor | float = 1.0):
        """`sigma` is in the task's action units (e.g. degrees on the SO-101); actions stay inside [low, high]."""
        self.inner, self.sigma, self.hold = inner, sigma, hold
        self.low, self.high = torch.as_tensor(low, dtype=torch.float32), torch.as_tensor(high, dtype=torch.float32)
        self.name = f"{inner.name}+noise{sigma:g}"
        self.g = torch.Generator().manual_seed(seed)
        self.noise: torch.Tensor | None = None
        self.calls = 0

    def act(self, obs: Obs) -> torch.Tensor:
        a = self.inner.act(obs).float()
        if self.noise is None or self.noise.shape[0] != a.shape[0] or self.calls % self.hold == 0:
            self.noise = torch.randn(a.shape, generator=self.g) * self.sigma
        self.calls += 1
        out = a + self.noise.to(a.device)
        return torch.maximum(torch.minimum(out, self.high.to(a.device)), self.low.to(a.device))


def _folder_config(spec: str) -> dict | None:
    """The config.json of the model folder or registry entry `spec`; None where there is none to read."""
    folder = Path(spec)
    if spec.startswith("registry:"):
        from roboloop.registry import resolve_model_ref

        folder = Path(resolve_model_ref(spec))
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):  # load_policy says what the folder is
        return None
    return cfg if isinstance(cfg, dict) else None


def reads_env_state(spec: str) -> bool:
    """Whether the policy `spec` names reads observation.environment_state (a LeRobot ENV input), asked before the
    environment is made: roboloop's tasks then observe their scene's state for it."""
    if spec in ("expert", "random"):
        return False
    if spec.startswith("serve://"):
        from roboloop.serving.client import PolicyClient

        with PolicyClient(spec) as c:
            return bool(c.info().get("env_state_dim"))
    from roboloop.datasets.layout import ENV_STATE

    features = (_folder_config(spec) or {}).get("input_features") or {}
    return isinstance(features, dict) and ENV_STATE in features


def reads_cameras(spec: str) -> bool:
    """Whether the model folder or registry entry `spec` reads a camera (roboloop's `data.camera_keys`, a LeRobot
    VISUAL input), asked before the environment is made: one that reads none is evaluated without rendering (the same
    episodes: rendering moves nothing). True where the folder does not say (a served policy says it itself)."""
    if spec in ("expert", "random"):
        return False
    cfg = _folder_config(spec) if not spec.startswith("serve://") else None
    if cfg is None:
        return True
    if isinstance(cfg.get("input_features"), dict):  # a LeRobot folder
        return any(isinstance(f, dict) and f.get("type") == "VISUAL" for f in cfg["input_features"].values())
    data = cfg.get("data")
    return not (isinstance(data, dict) and data.get("camera_keys") == [] and not cfg.get("model", {}).get(
        "vision_encoder"))


def served_policy(spec: str, precision: str = "fp32") -> Any:
    """A connected client of the policy server `spec` (`serve://HOST:PORT`, token from $ROBOLOOP_SERVE_TOKEN_FILE),
    made before any environment so that its model can be asked what it reads; `fits` checks it against one."""
    if precision != "fp32":
        raise ValueError(f"precision {precision}: a server acts in its own precision (roboloop serve --precision)")
    from roboloop.serving.client import RemotePolicy

    return RemotePolicy(spec)


def fits(policy: Any, env: BatchedEnv, spec: str) -> Any:
    """`policy`, or ModelMismatchError when its actions are not the ones `env` takes."""
    if policy.action_dim != env.action_dim:
        raise ModelMismatchError(f"{spec}: the model outputs {policy.action_dim}-dim actions, {env.task} takes "
                                 f"{env.action_dim}: it was trained for another robot or task")
    return policy


def make_policy(spec: str, env: BatchedEnv, device: str = "cpu", seed: int = 0, precision: str = "fp32"):
    """`expert`, `random`, a model folder, a registry reference (`registry:NAME@ALIAS|VERSION`) or a policy
    server (`serve://HOST:PORT`: `served_policy`); a model acts in `precision`."""
    if spec.startswith("serve://"):
        return fits(served_policy(spec, precision), env, spec)
    if precision != "fp32" and spec in ("expert", "random"):
        raise ValueError(f"precision {precision}: the {spec} policy has no network to run in it")
    if spec == "expert":
        return ExpertPolicy(env)
    if spec == "random":
        return RandomPolicy(env, seed)
    from roboloop.policies import load_policy

    if spec.startswith("registry:"):
        from roboloop.registry import resolve_model_ref

        return fits(load_policy(resolve_model_ref(spec), device, seed=seed, precision=precision), env, spec)
    return fits(load_policy(spec, device, seed=seed, precision=precision), env, spec)
