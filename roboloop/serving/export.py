"""`roboloop export REF --format onnx`: roboloop's VLA as an ONNX graph that onnxruntime runs (and `roboloop serve`
serves), checked against PyTorch before it is written.

What the graph is: one observation (batch 1) -> one action chunk, the backbone and the flow-matching head with
its K Euler steps unrolled (K = the model's `inference_steps`), the initial noise an input (so a chunk is
reproducible and the same noise gives PyTorch's chunk). What stays outside, in Python: normalising the state,
resizing camera frames to the model's input, un-normalising the chunk, drawing the noise. What the export fixes:
the instruction (its tokens are part of the packed sequence whose layout the graph bakes in: export once per
instruction the robot uses), the camera set and K. LeRobot's ACT: see `export_lerobot` (Diffusion is not exported).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roboloop.policies.obs import Obs
from roboloop.serving.export_files import EXPORT_FILE, ONNX_FILE

TOLERANCE = 1e-4  # max |onnx - torch| over the check observations, in normalised action units


class _Unrolled(torch.nn.Module):
    """The VLA's `sample_actions` for one packed sample, with its K Euler steps unrolled."""

    def __init__(self, model: Any, template: Any, steps: int):
        super().__init__()
        self.model, self.template, self.steps = model, template, steps

    def forward(self, states: torch.Tensor, images: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        from dataclasses import replace

        b = replace(self.template, states=states, images=images)
        ctx, cu, max_len = self.model.encode(b)
        x = noise
        for i in range(self.steps):
            t = torch.full((1,), i / self.steps, dtype=noise.dtype)
            x = x + self.model.velocity(ctx, cu, max_len, x, t).float() / self.steps
        return x


def _check_obs(policy: Any, n: int, seed: int, instruction: str) -> list[Obs]:
    """Observations spread like the training data: state ~ N(mean, std) of the dataset's stats, random frames."""
    g = np.random.default_rng(seed)
    s = policy.stats[policy.state_key]
    h, w = policy.image_size
    out = []
    for _ in range(n):
        state = (s["mean"] + s["std"] * g.normal(size=policy.state_dim)).astype(np.float32)[None]
        images = {k: torch.from_numpy(g.integers(0, 256, (1, h, w, 3), dtype=np.uint8)) for k in policy.camera_keys}
        out.append(Obs(torch.from_numpy(state), images, [instruction]))
    return out


def export_onnx(folder: str | Path, dst: str | Path, instruction: str = "", checks: int = 8,
                overwrite: bool = False) -> dict[str, Any]:
    """Write `dst/` (model.onnx, export.json, the source's config/stats/policy JSON); refuses when onnxruntime's
    chunks differ from PyTorch's by more than TOLERANCE on `checks` observations. Nothing is written on failure;
    an existing folder is replaced only if roboloop exported it and `overwrite`."""
    from roboloop import fsutil
    from roboloop.policies import can, family, model_info

    folder, dst = Path(folder), Path(dst)
    info = model_info(folder)
    if not can(info.family, "onnx"):
        raise ValueError(f"{folder}: ONNX export covers roboloop's VLA and LeRobot's ACT; policy family "
                         f"{info.family!r} is not exported (serve it from its folder)")
    export = _named(family(info.family).onnx_export)  # type: ignore[attr-defined]
    with fsutil.atomic_dir(dst, "onnx_export", overwrite=overwrite) as tmp:
        meta = export(folder, tmp, checks, instruction)
        fsutil.atomic_write_json(tmp / EXPORT_FILE, meta)
    return meta | {"path": str(dst)}


def _named(path: str) -> Any:
    """A function or class a built-in family names in its code (never a name read from a file)."""
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def export_vla(folder: Path, tmp: Path, checks: int, instruction: str) -> dict[str, Any]:
    """roboloop's VLA as one graph in `tmp` (its K denoising steps unrolled, the noise an input), checked against
    PyTorch on `checks` observations; returns export.json's content."""
    import onnxruntime as ort

    from roboloop.policies import load_policy

    policy: Any = load_policy(folder)
    model, steps = policy.model.eval(), policy.steps or policy.model.cfg.inference_steps
    probe = _check_obs(policy, checks + 1, 0, instruction)
    template = policy.batch(probe[0])
    wrapper = _Unrolled(model, template, steps).eval()
    noise = torch.randn(1, model.cfg.horizon, model.cfg.action_dim, generator=torch.Generator().manual_seed(0))
    # The TorchScript tracer, deliberately: torch.export (dynamo) stops at the packed layout's data-dependent
    # sizes (`int(cu[-1])`), which a trace of one observation bakes in as constants, as intended here.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(wrapper, (template.states, template.images, noise), str(tmp / ONNX_FILE), dynamo=False,
                          input_names=["states", "images", "noise"], output_names=["chunk"], opset_version=17)
    sess = ort.InferenceSession(str(tmp / ONNX_FILE), providers=["CPUExecutionProvider"])
    worst = 0.0
    g = torch.Generator().manual_seed(1)
    for obs in probe[1:]:
        b = policy.batch(obs)
        z = torch.randn(noise.shape, generator=g)
        with torch.no_grad():
            ref = wrapper(b.states, b.images, z).numpy()
        feeds = {"states": b.states.numpy(), "images": b.images.numpy(), "noise": z.numpy()}
        got = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})[0]  # a state-only model has
        # no images input (the trace drops an unused one)
        worst = max(worst, float(np.abs(got - ref).max()))
    if worst > TOLERANCE:
        raise ValueError(f"{folder}: the ONNX graph's chunks differ from PyTorch's by {worst:.2e} (> {TOLERANCE})")
    for f in ("config.json", "stats.json", "policy.json"):
        if (folder / f).is_file():
            shutil.copy2(folder / f, tmp / f)
    meta = {"format": "onnx", "opset": 17, "family": "vla", "source": str(folder.resolve()),
            "instruction": instruction,
            "inference_steps": steps, "camera_keys": list(policy.camera_keys),
            "image_size": list(policy.image_size),
            "state_dim": policy.state_dim, "action_dim": policy.action_dim, "horizon": policy.horizon,
            "batch": 1, "checks": checks, "max_abs_diff": worst, "tolerance": TOLERANCE,
            "check_observations": "state ~ N(mean, std) of the training stats, uniform random camera frames",
            "inputs": {"states": list(template.states.shape), "images": list(template.images.shape),
                       "noise": list(noise.shape)}}
    return meta


class OnnxPolicy:
    """An export folder run by onnxruntime behind the Policy interface (batch rows run one by one)."""

    def __init__(self, folder: str | Path, seed: int = 0):
        import onnxruntime as ort

        from roboloop.policies.vla import ModelPolicy
        from roboloop.training.config import ModelConfig

        self.dir = Path(folder)
        self.meta = json.loads((self.dir / EXPORT_FILE).read_text())
        cfg = json.loads((self.dir / "config.json").read_text())
        pre = ModelPolicy.__new__(ModelPolicy)  # its pre/post-processing only: no weights are loaded
        pre.dir, pre.cfg, pre.data = self.dir, ModelConfig(**cfg["model"]), cfg.get("data", {})
        st = json.loads((self.dir / "stats.json").read_text())
        pre.stats = {k: {s: np.asarray(v, dtype=np.float32) for s, v in d.items()} for k, d in st.items()}
        pre.device, pre._tok = torch.device("cpu"), {}
        self.pre = pre
        self.sess = ort.InferenceSession(str(self.dir / ONNX_FILE), providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.sess.get_inputs()]
        self.g = torch.Generator().manual_seed(seed)
        self.name = f"onnx:{self.dir.name}"
        self.state_dim, self.action_dim, self.horizon = pre.cfg.state_dim, pre.cfg.action_dim, pre.cfg.horizon
        self.state_key, self.action_key = pre.data.get("state_key", "observation.state"), pre.data.get("action_key",
                                                                                                       "action")
        self.camera_keys, self.image_size, self.stats = pre.camera_keys, tuple(pre.cfg.image_size), pre.stats
        self.instruction = self.meta["instruction"]

    def act(self, obs: Obs) -> torch.Tensor:
        wrong = {s for s in obs.instructions if s != self.instruction}
        if wrong:
            raise ValueError(f"{self.dir}: exported for the instruction {self.instruction!r}, asked "
                             f"{sorted(wrong)[0]!r} (export once per instruction)")
        state = self.pre._norm(self.state_key, obs.state.cpu().numpy().astype(np.float32))
        per_row = self.pre._images(obs)
        out = []
        for i in range(obs.state.shape[0]):
            noise = torch.randn(1, self.horizon, self.action_dim, generator=self.g)
            images = torch.stack(per_row[i]).numpy() if per_row[i] else np.zeros((0, 3, *self.image_size), np.float32)
            feeds = {"states": state[i:i + 1], "images": images.astype(np.float32), "noise": noise.numpy()}
            chunk = self.sess.run(None, {k: feeds[k] for k in self.inputs})[0]
            out.append(torch.from_numpy(chunk))
        return self.pre.unnormalise(torch.cat(out))


def open_export(folder: str | Path, seed: int = 0) -> Any:
    """An export folder behind the Policy interface: the VLA's `OnnxPolicy` or LeRobot's `OnnxLeRobotPolicy`."""
    from roboloop.policies import can, family

    meta = json.loads((Path(folder) / EXPORT_FILE).read_text())
    name = str(meta.get("family", "vla"))
    if not can(name, "onnx"):  # family() refuses a name that is not a built-in or allowed one before importing it
        raise ValueError(f"{folder}: export.json names policy family {name!r}, which has no ONNX runtime")
    return _named(family(name).onnx_policy)(folder, seed)  # type: ignore[attr-defined]
