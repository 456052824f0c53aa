"""roboloop's GR00T-N1.5-style VLA as a policy family (see `roboloop.policies` for the protocol).

Model folder: model.safetensors, config.json ({"model": ModelConfig, "train", "data", "split"}),
stats.json (mean/std of state and action), policy.json (roboloop's family-independent metadata).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from roboloop.errors import CorruptFileError, ModelMismatchError
from roboloop.policies import DataNeeds, Features, ModelInfo
from roboloop.policies.obs import Obs
from roboloop.training.augment import shift_images, shifts
from roboloop.training.config import ModelConfig
from roboloop.training.model import VLAPolicy, train_flops
from roboloop.training.packing import PackedBatch


def flow_noise(keys: list[int], step: int, seed: int, horizon: int, action_dim: int) -> tuple[torch.Tensor, ...]:
    """Per-sample noise and time draws seeded by (seed, step, key): independent of how samples are split."""
    noise, u = [], []
    for k in keys:
        g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 10_000_019 + k)
        noise.append(torch.randn(horizon, action_dim, generator=g))
        u.append(torch.rand(1, generator=g))
    return torch.stack(noise), torch.cat(u)


@dataclass
class VLATrainable:
    module: VLAPolicy
    needs: DataNeeds
    config: ModelConfig
    seed: int
    image_shift: int = 0  # TrainRecipe.image_shift: training images moved by up to this many pixels
    kind: str = "vla"  # what `compile=auto`'s measurements are keyed by

    def loss_inputs(self, batch: PackedBatch, keys: list[int], step: int, denominator: float) -> tuple:
        noise, u = flow_noise(keys, step, self.seed, self.config.horizon, self.config.action_dim)
        if self.image_shift and batch.images.shape[0]:
            offsets = shifts(keys, step, self.seed, self.image_shift, self.config.max_cameras)
            offsets = offsets.to(batch.images.device)[batch.image_sample, batch.image_camera]
            batch = replace(batch, images=shift_images(batch.images, offsets, batch.image_hw))
        return batch, noise, u, denominator

    def flops(self, batch: PackedBatch) -> float | None:
        return train_flops(self.config, batch.seq_lens.tolist(), int(batch.images.shape[0]))

    def kernels(self, device_type: str, dtype: torch.dtype) -> dict:
        from roboloop.training.attention import explain_backend

        choice, why = explain_backend(self.config.attention, device_type, dtype)
        return {"attention": choice, "attention_reason": why}

    def extra_metrics(self) -> dict:
        aux = self.module.last_aux_loss  # this rank's auxiliary-target L1 (normalised units)
        return {} if aux is None else {"aux_loss": float(aux)}


class VLAFamily:
    name = "vla"
    capabilities = frozenset({"rl", "onnx"})
    onnx_export = "roboloop.serving.export:export_vla"  # its K denoising steps unrolled into one graph
    onnx_policy = "roboloop.serving.export:OnnxPolicy"

    def build(self, cfg, features: Features) -> VLATrainable:
        mcfg = cfg.model_config_resolved(features.state_dim, features.action_dim, features.aux_dim)
        model = VLAPolicy(mcfg)
        model.aux_weight = cfg.aux_weight
        needs = DataNeeds(horizon=mcfg.horizon, cameras=cfg.with_video, image_size=tuple(mcfg.image_size),
                          tokens_per_image=mcfg.tokens_per_image, state_tokens=mcfg.num_state_tokens,
                          max_text_len=mcfg.max_text_len, tokenizer=mcfg.tokenizer)
        return VLATrainable(model, needs, mcfg, cfg.seed, cfg.image_shift)

    def load_init(self, trainable: VLATrainable, init: Path, keys: list[str]) -> dict:
        """Load `init`'s weights (same architecture required); return its normalisation stats, which the
        continued run keeps so that the weights go on meaning what they meant."""
        from safetensors.torch import load_file

        for f in ("model.safetensors", "config.json", "stats.json"):
            if not (init / f).is_file():
                raise FileNotFoundError(f"init_from {init}: missing {f}; not a finished roboloop VLA model")
        saved = json.loads((init / "config.json").read_text()).get("model")
        if saved is None:
            raise ModelMismatchError(f"init_from {init}: not a roboloop VLA folder (its config.json has no model)")
        now = trainable.config.model_dump(mode="json")
        diff = sorted(k for k in now if k in saved and json.dumps(saved[k]) != json.dumps(now[k]))
        if diff:
            raise ModelMismatchError(f"init_from {init}: its model differs in {', '.join(diff)} "
                                     f"({', '.join(f'{k}={saved[k]!r} vs {now[k]!r}' for k in diff[:3])})")
        trainable.module.load_state_dict(load_file(init / "model.safetensors"))
        stats = json.loads((init / "stats.json").read_text())
        missing = [k for k in keys if k not in stats]
        if missing:
            raise ModelMismatchError(f"init_from {init}: stats.json has no {missing}; it was trained on other "
                                     "features")
        return {k: stats[k] for k in keys}

    def write_meta(self, out: Path, trainable: VLATrainable, info: ModelInfo, data: dict) -> None:
        from roboloop import fsutil

        fsutil.atomic_write_json(out / "config.json", {"model": trainable.config.model_dump(), "train": info.train,
                                                       "data": data, "split": info.split})

    def load(self, folder: Path, device: str = "cpu", seed: int = 0,
             inference_steps: int | None = None) -> ModelPolicy:
        return ModelPolicy(folder, device, inference_steps, seed)


class ModelPolicy:
    """A model folder written by `roboloop train` (model.safetensors, config.json, stats.json)."""

    def __init__(self, model_dir: str | Path, device: str = "cpu", inference_steps: int | None = None,
                 seed: int = 0):
        from safetensors.torch import load_file

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
        self.seed = seed
        self.name = f"model:{self.dir.name}"
        self.state_dim, self.action_dim, self.horizon = self.cfg.state_dim, self.cfg.action_dim, self.cfg.horizon
        self.state_key, self.action_key = self.data["state_key"], self.data["action_key"]
        self.image_size = tuple(self.cfg.image_size)
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
        x0 = None
        if obs.keys is not None and self.model.cfg.initial_noise == "sample":  # per (episode, step): batch-free
            from roboloop.policies.obs import row_generator

            shape = (self.model.cfg.horizon, self.model.cfg.action_dim)
            x0 = torch.stack([torch.randn(shape, generator=row_generator(self.seed, k)) for k in obs.keys])
        chunk = self.model.sample_actions(self.batch(obs), steps=self.steps, generator=self.g, x0=x0)
        return self.unnormalise(chunk)
