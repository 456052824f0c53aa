"""Policies the Evaluator runs: random, the task's scripted expert, and a trained VLA model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from roboloop.errors import CorruptFileError, ModelMismatchError
from roboloop.evaluation.protocol import BatchedEnv, Obs


class RandomPolicy:
    name = "random"

    def __init__(self, env: BatchedEnv, seed: int = 0):
        self.low, self.high = env.action_low, env.action_high
        self.g = torch.Generator().manual_seed(seed)

    def act(self, obs: Obs) -> torch.Tensor:
        u = torch.rand(obs.state.shape[0], self.low.shape[0], generator=self.g)
        return self.low + u * (self.high - self.low)


class ExpertPolicy:
    name = "expert"

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

    def __init__(self, inner, sigma: float, seed: int = 0, hold: int = 4):
        self.inner, self.sigma, self.hold = inner, sigma, hold
        self.name = f"{inner.name}+noise{sigma:g}"
        self.g = torch.Generator().manual_seed(seed)
        self.noise: torch.Tensor | None = None
        self.calls = 0

    def act(self, obs: Obs) -> torch.Tensor:
        a = self.inner.act(obs).float()
        if self.noise is None or self.noise.shape[0] != a.shape[0] or self.calls % self.hold == 0:
            self.noise = torch.randn(a.shape, generator=self.g) * self.sigma
        self.calls += 1
        return (a + self.noise.to(a.device)).clamp(-1.0, 1.0)


class ModelPolicy:
    """A model folder written by `roboloop train` (model.safetensors, config.json, stats.json)."""

    def __init__(self, model_dir: str | Path, device: str = "cpu", inference_steps: int | None = None,
                 seed: int = 0):
        from safetensors.torch import load_file

        from roboloop.training.config import ModelConfig
        from roboloop.training.model import VLAPolicy

        self.dir = Path(model_dir)
        for f in ("model.safetensors", "config.json", "stats.json"):
            if not (self.dir / f).exists():
                raise FileNotFoundError(f"{self.dir}: missing {f}; not a roboloop model folder")
        try:
            cfg = json.loads((self.dir / "config.json").read_text())
        except ValueError as e:
            raise CorruptFileError(f"{self.dir / 'config.json'} is not valid JSON ({e})") from e
        self.cfg = ModelConfig(**cfg["model"])
        self.data = cfg.get("data", {"state_key": "observation.state", "action_key": "action", "camera_keys": [],
                                     "with_video": True})
        self.device = torch.device(device)
        self.model = VLAPolicy(self.cfg)
        try:
            weights = load_file(self.dir / "model.safetensors")
        except Exception as e:  # safetensors raises its own error types for truncated/garbled headers
            raise CorruptFileError(f"{self.dir / 'model.safetensors'} cannot be read ({e}); download the model "
                                   "again or retrain it") from e
        try:
            self.model.load_state_dict(weights)
        except RuntimeError as e:
            raise ModelMismatchError(f"{self.dir / 'model.safetensors'} does not match its config.json "
                                     f"({str(e).splitlines()[0]})") from e
        self.model.to(self.device).eval()
        st = json.loads((self.dir / "stats.json").read_text())
        self.stats = {k: {s: np.asarray(v, dtype=np.float32) for s, v in d.items()} for k, d in st.items()}
        self.steps = inference_steps
        self.g = torch.Generator(device=self.device).manual_seed(seed)
        self.name = f"model:{self.dir.name}"
        self._tok: dict[str, torch.Tensor] = {}

    def _norm(self, key: str, x: np.ndarray) -> np.ndarray:
        s = self.stats[key]
        return (x - s["mean"]) / np.maximum(s["std"], 1e-6)

    def _tokens(self, text: str) -> torch.Tensor:
        if text not in self._tok:
            if self.cfg.tokenizer:
                from roboloop.training.hf import text_tokens

                self._tok[text] = text_tokens(self.cfg.tokenizer, text, self.cfg.max_text_len)
            else:
                from roboloop.training.data import byte_tokens

                self._tok[text] = byte_tokens(text, self.cfg.max_text_len)
        return self._tok[text]

    @property
    def camera_keys(self) -> list[str]:
        """The cameras the model was trained on, in its input order (older folders recorded `video_keys`)."""
        if not self.data.get("with_video", True):
            return []
        return list(self.data.get("camera_keys", self.data.get("video_keys")) or [])

    def _images(self, obs: Obs) -> list[list[torch.Tensor]]:
        from roboloop.datasets.cameras import to_model_input

        keys = self.camera_keys
        if not keys:
            return [[] for _ in range(obs.state.shape[0])]
        depth_mm = {c["key"]: tuple(c["depth_mm"]) for c in self.data.get("cameras", []) if c.get("depth_mm")}
        h, w = self.cfg.image_size
        per_cam = []
        for j, k in enumerate(keys):
            frames = obs.images[k] if k in obs.images else list(obs.images.values())[j]
            x = to_model_input(frames.numpy() if isinstance(frames, torch.Tensor) else frames, depth_mm.get(k))
            if x.shape[-2:] != (h, w):
                x = F.interpolate(x, size=(h, w), mode="bilinear", antialias=True, align_corners=False)
            per_cam.append(x)
        return [[c[i] for c in per_cam] for i in range(obs.state.shape[0])]

    def batch(self, obs: Obs):
        """The packed model input (normalised state, instruction tokens, resized images) for every env in `obs`."""
        from roboloop.training.packing import Sample, collate

        sk = self.data["state_key"]
        if obs.state.shape[1] != self.cfg.state_dim:
            raise ModelMismatchError(f"{self.dir}: the model takes a {self.cfg.state_dim}-dim state, the environment "
                                     f"gives {obs.state.shape[1]}: it was trained on another task's data")
        state = self._norm(sk, obs.state.cpu().numpy().astype(np.float32))
        imgs = self._images(obs)
        h, a = self.cfg.horizon, self.cfg.action_dim
        samples = [Sample(imgs[i], self._tokens(obs.instructions[i] if obs.instructions else ""),
                          torch.from_numpy(state[i]), torch.zeros(h, a), torch.ones(h, dtype=torch.bool))
                   for i in range(state.shape[0])]
        return collate(samples, self.cfg.tokens_per_image, self.cfg.num_state_tokens).to(self.device)

    def unnormalise(self, chunk: torch.Tensor) -> torch.Tensor:
        """Normalised (N, H, A) model actions -> the env's units."""
        s = self.stats[self.data["action_key"]]
        std = torch.from_numpy(np.maximum(s["std"], 1e-6)).to(chunk.device)
        return (chunk.float() * std + torch.from_numpy(s["mean"]).to(chunk.device)).cpu().float()

    @torch.no_grad()
    def act(self, obs: Obs) -> torch.Tensor:
        chunk = self.model.sample_actions(self.batch(obs), steps=self.steps, generator=self.g)
        return self.unnormalise(chunk)


def make_policy(spec: str, env: BatchedEnv, device: str = "cpu", seed: int = 0):
    """`expert`, `random`, a model folder, or a registry reference (`registry:NAME@ALIAS|VERSION`)."""
    if spec == "expert":
        return ExpertPolicy(env)
    if spec == "random":
        return RandomPolicy(env, seed)
    if spec.startswith("registry:"):
        from roboloop.registry import resolve_model_ref

        policy = ModelPolicy(resolve_model_ref(spec), device, seed=seed)
    else:
        policy = ModelPolicy(spec, device, seed=seed)
    if policy.cfg.action_dim != env.action_dim:
        raise ModelMismatchError(f"{spec}: the model outputs {policy.cfg.action_dim}-dim actions, {env.task} takes "
                                 f"{env.action_dim}: it was trained for another robot or task")
    return policy
