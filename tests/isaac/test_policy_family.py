"""The policy seam is real: a second family, defined only here (a linear map from the normalised state to an
action chunk), goes through the whole closed loop (`roboloop loop`: train, evaluate in the reach task beside the
random baseline, register) and is resolved back through the registry, with no change outside this module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from roboloop.policies import DataNeeds

pytestmark = [pytest.mark.isaac, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
FAMILY = "tests.isaac.test_policy_family:LinearFamily"


class LinearNet(nn.Module):
    def __init__(self, state_dim: int, horizon: int, action_dim: int):
        super().__init__()
        self.shape = (horizon, action_dim)
        self.lin = nn.Linear(state_dim, horizon * action_dim)

    def predict(self, state: torch.Tensor) -> torch.Tensor:
        return self.lin(state.float()).view(-1, *self.shape)

    def forward(self, state, actions, mask, denominator):  # the training loss
        err = ((self.predict(state) - actions.float()) ** 2).mean(-1)
        return (err * mask.float()).sum() / denominator


class LinearTrainable:
    def __init__(self, net: LinearNet, horizon: int):
        self.module, self.needs = net, DataNeeds(horizon=horizon, cameras=False)

    def loss_inputs(self, batch, keys, step, denominator):
        return batch.states, batch.actions, batch.action_mask, denominator

    def flops(self, batch):
        return None

    def extra_metrics(self):
        return {}


class LinearPolicy:
    def __init__(self, folder: Path, device: str):
        from safetensors.torch import load_file

        from roboloop.policies import model_info

        info = model_info(folder)
        self.name, self.state_dim, self.action_dim, self.horizon = "linear", info.state_dim, info.action_dim, \
            info.horizon
        self.state_key, self.action_key, self.camera_keys, self.image_size = info.state_key, info.action_key, [], (0, 0)
        self.stats = {k: {s: np.asarray(v, np.float32) for s, v in d.items()}
                      for k, d in json.loads((folder / "stats.json").read_text()).items()}
        self.net = LinearNet(self.state_dim, self.horizon, self.action_dim)
        self.net.load_state_dict(load_file(folder / "model.safetensors"))

    @torch.no_grad()
    def act(self, obs):
        s, a = self.stats[self.state_key], self.stats[self.action_key]
        x = (obs.state.cpu().numpy() - s["mean"]) / np.maximum(s["std"], 1e-6)
        y = self.net.predict(torch.from_numpy(x.astype(np.float32))).numpy()
        return torch.from_numpy(y * np.maximum(a["std"], 1e-6) + a["mean"]).float()


class NotAFamily:
    name = "nothing"


class LinearFamily:
    name = "linear"
    capabilities = frozenset()

    def build(self, cfg, features):
        horizon = int(cfg.model_overrides.get("horizon", 8))
        return LinearTrainable(LinearNet(features.state_dim, horizon, features.action_dim), horizon)

    def load_init(self, trainable, folder, keys):
        from safetensors.torch import load_file

        trainable.module.load_state_dict(load_file(folder / "model.safetensors"))
        return {k: v for k, v in json.loads((folder / "stats.json").read_text()).items() if k in keys}

    def write_meta(self, out, trainable, info, data):
        (out / "linear.json").write_text(json.dumps({"shape": list(trainable.module.shape)}))

    def load(self, folder, device="cpu", seed=0, inference_steps=None):
        return LinearPolicy(Path(folder), device)


def test_a_family_defined_in_a_test_goes_through_the_loop_and_the_registry(tmp_path, monkeypatch):
    from roboloop.loop import ci

    cfg = ci()
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"family": FAMILY, "steps": 60, "lr": 3e-3}),
                                 "model_name": "reach-linear"})
    (tmp_path / "loop.json").write_text(cfg.model_dump_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROBOLOOP_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])  # children import this module
    env["ROBOLOOP_POLICY_FAMILIES"] = FAMILY  # the operator allows it (a recipe naming code alone does not)
    p = subprocess.run([sys.executable, "-m", "roboloop.cli", "loop", "--config", "loop.json"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["registry_version"] == 1

    from roboloop.policies import load_policy, model_info
    from roboloop.registry import Registry, resolve_model_ref

    reg = Registry(tmp_path / ".roboloop" / "registry")
    lineage = reg.lineage("reach-linear", 1)
    assert lineage["family"] == FAMILY and lineage["model"]["family"] == FAMILY
    assert lineage["eval"]["episodes"] == 6 and lineage["baseline_eval"]["policy"] == "random"
    assert summary["success_rate"] == pytest.approx(lineage["eval"]["successes"] / 6)  # what the registry holds
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROBOLOOP_POLICY_FAMILIES", FAMILY)
    monkeypatch.setenv("ROBOLOOP_REGISTRY", str(tmp_path / ".roboloop" / "registry"))
    folder = resolve_model_ref("registry:reach-linear@1")
    assert model_info(folder).family == FAMILY and (folder / "linear.json").is_file()
    policy = load_policy(folder)
    assert isinstance(policy, LinearPolicy)
    from roboloop.policies.obs import Obs

    chunk = policy.act(Obs(torch.zeros(3, policy.state_dim), {}, ["", "", ""]))
    assert chunk.shape == (3, 8, policy.action_dim) and torch.isfinite(chunk).all()


def test_an_unknown_or_incomplete_family_is_refused_by_name(monkeypatch):
    from roboloop.policies import UnknownFamilyError, family

    with pytest.raises(UnknownFamilyError, match="unknown policy family 'act'"):
        family("act")
    with pytest.raises(UnknownFamilyError, match="is not allowed: .*ROBOLOOP_POLICY_FAMILIES"):
        family(FAMILY)
    monkeypatch.setenv("ROBOLOOP_POLICY_FAMILIES", ",".join(
        f"tests.isaac.test_policy_family:{c}" for c in ("NoSuchFamily", "NotAFamily")))
    with pytest.raises(UnknownFamilyError, match="cannot be loaded"):
        family("tests.isaac.test_policy_family:NoSuchFamily")
    with pytest.raises(UnknownFamilyError, match="lacks build, load_init, write_meta, load"):
        family("tests.isaac.test_policy_family:NotAFamily")
