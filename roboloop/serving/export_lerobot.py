"""ONNX export of LeRobot's ACT (the `lerobot` policy family): LeRobot's network as a graph that onnxruntime runs,
LeRobot's own pre/post-processors around it, checked against PyTorch before anything is written.

What the graph is: ACT's `model` in inference mode (the CVAE's latent is zero, as in LeRobot's
`predict_action_chunk`), from the preprocessed inputs (normalised state, environment state if the policy reads
it, each camera at its own resolution) to the normalised action chunk (`chunk_size` steps), one observation at a
time. What stays outside, in Python: LeRobot's preprocessor (normalisation, resizing) and postprocessor
(un-normalisation), loaded from the same folder as in PyTorch. Diffusion is not exported: its denoising loop
draws fresh noise at every step and keeps a queue of past observations; serve it from its folder.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roboloop.datasets.layout import ENV_STATE
from roboloop.policies.lerobot import LeRobotPolicy
from roboloop.policies.obs import Obs

EXPORTABLE = ("act",)
NOT_EXPORTABLE = {"diffusion": "its denoising loop draws noise at every step and keeps a queue of past "
                               "observations"}


class _ActGraph(torch.nn.Module):
    """ACT's network on positional inputs: (state?, environment state?, camera 1, camera 2, ...)."""

    def __init__(self, model: torch.nn.Module, has_state: bool, has_env: bool):
        super().__init__()
        self.model, self.has_state, self.has_env = model, has_state, has_env

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        from lerobot.utils.constants import OBS_ENV_STATE, OBS_IMAGES, OBS_STATE

        batch: dict[str, Any] = {}
        i = 0
        if self.has_state:
            batch[OBS_STATE], i = inputs[i], i + 1
        if self.has_env:
            batch[OBS_ENV_STATE], i = inputs[i], i + 1
        if i < len(inputs):
            batch[OBS_IMAGES] = list(inputs[i:])
        return self.model(batch)[0]


def input_keys(cfg: Any) -> tuple[list[str], bool, bool]:
    """The graph's inputs (LeRobot feature keys, in order) and whether it reads the state / environment state."""
    from lerobot.utils.constants import OBS_ENV_STATE, OBS_STATE

    has_state, has_env = cfg.robot_state_feature is not None, cfg.env_state_feature is not None
    keys = ([OBS_STATE] if has_state else []) + ([OBS_ENV_STATE] if has_env else []) + list(cfg.image_features)
    return keys, has_state, has_env


def _probe(policy: Any, n: int, seed: int) -> list[Obs]:
    """Observations spread like the training data: state ~ N(mean, std) of the stats, random frames per camera."""
    g = np.random.default_rng(seed)
    s = policy.stats.get(policy.state_key, {})
    mean = np.asarray(s.get("mean", np.zeros(policy.state_dim)), dtype=np.float32)
    std = np.asarray(s.get("std", np.ones(policy.state_dim)), dtype=np.float32)
    out = []
    for _ in range(n):
        state = (mean + std * g.normal(size=policy.state_dim)).astype(np.float32)[None]
        images = {k: torch.from_numpy(g.integers(0, 256, (1, *policy.cfg.input_features[k].shape[1:], 3),
                                                 dtype=np.uint8)) for k in policy.camera_keys}
        env = None
        if policy.env_state_dim:  # the scene's state, spread like its stats too
            e = policy.stats.get(ENV_STATE, {})
            e_mean = np.asarray(e.get("mean", np.zeros(policy.env_state_dim)), dtype=np.float32)
            e_std = np.asarray(e.get("std", np.ones(policy.env_state_dim)), dtype=np.float32)
            env = torch.from_numpy((e_mean + e_std * g.normal(size=policy.env_state_dim)).astype(np.float32)[None])
        out.append(Obs(torch.from_numpy(state), images, [""], env))
    return out


def export_lerobot(folder: Path, tmp: Path, checks: int, instruction: str = "") -> dict[str, Any]:
    """Write the graph and the folder's LeRobot and roboloop metadata into `tmp`; raises when onnxruntime's
    chunks differ from PyTorch's by more than the export's TOLERANCE (normalised units) on `checks` observations.
    (`instruction` is the VLA's: LeRobot's ACT reads no language.)"""
    import onnxruntime as ort

    from roboloop.policies import WEIGHTS_FILE
    from roboloop.serving.export import TOLERANCE as tolerance
    from roboloop.serving.export_files import ONNX_FILE as onnx_file

    config = folder / "config.json"
    kind = json.loads(config.read_text()).get("type") if config.is_file() else None
    if kind not in EXPORTABLE:
        why = NOT_EXPORTABLE.get(str(kind), "only ACT's graph is exported so far")
        raise ValueError(f"{folder}: LeRobot's {kind} is not exported to ONNX ({why}); serve it from its folder")
    policy = LeRobotPolicy(folder)
    keys, has_state, has_env = input_keys(policy.cfg)
    graph = _ActGraph(policy.network.model, has_state, has_env).eval()
    probe = _probe(policy, checks + 1, 0)
    first = policy.inputs(probe[0])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(graph, tuple(first[k] for k in keys), str(tmp / onnx_file), dynamo=False,
                          input_names=keys, output_names=["chunk"], opset_version=17)
    sess = ort.InferenceSession(str(tmp / onnx_file), providers=["CPUExecutionProvider"])
    worst = 0.0
    for obs in probe[1:]:
        inputs = policy.inputs(obs)
        ref = policy.chunk(inputs).cpu().numpy()
        got = sess.run(None, {k: inputs[k].cpu().numpy().astype(np.float32) for k in keys})[0]
        worst = max(worst, float(np.abs(got - ref).max()))
    if worst > tolerance:
        raise ValueError(f"{folder}: the ONNX graph's chunks differ from PyTorch's by {worst:.2e} (> {tolerance})")
    for f in folder.iterdir():  # LeRobot's config and processors, roboloop's policy.json/stats.json; not weights
        if f.is_file() and f.name != WEIGHTS_FILE:
            shutil.copy2(f, tmp / f.name)
    return {"format": "onnx", "opset": 17, "family": "lerobot", "policy_type": kind, "source": str(folder.resolve()),
            "inputs": {k: list(first[k].shape) for k in keys}, "chunk": [policy.horizon, policy.action_dim],
            "batch": 1, "checks": checks, "max_abs_diff": worst, "tolerance": tolerance,
            "check_observations": "state (and environment state) ~ N(mean, std) of the stats, uniform random "
                                  "camera frames",
            "outside_the_graph": "LeRobot's preprocessor and postprocessor from this folder"}


class OnnxLeRobotPolicy(LeRobotPolicy):
    """An ACT export run by onnxruntime behind the Policy interface: LeRobot's processors, the graph per row."""

    def __init__(self, folder: str | Path, seed: int = 0):
        import onnxruntime as ort

        from roboloop.serving.export_files import EXPORT_FILE, ONNX_FILE

        folder = Path(folder)
        super().__init__(folder, "cpu", weights=False)
        self.meta = json.loads((folder / EXPORT_FILE).read_text())
        self.sess = ort.InferenceSession(str(folder / ONNX_FILE), providers=["CPUExecutionProvider"])
        self.keys = [i.name for i in self.sess.get_inputs()]
        self.name = f"onnx:{folder.name}"

    def chunk(self, inputs: dict) -> torch.Tensor:
        n = inputs[self.keys[0]].shape[0]
        rows = [self.sess.run(None, {k: inputs[k][i:i + 1].cpu().numpy().astype(np.float32) for k in self.keys})[0]
                for i in range(n)]
        return torch.from_numpy(np.concatenate(rows))
