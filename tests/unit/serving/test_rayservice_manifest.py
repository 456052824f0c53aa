"""infra/kuberay/rayservice-policy.yaml names an application builder that exists and arguments it accepts."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from roboloop.serving.server import ServeConfig

ROOT = Path(__file__).resolve().parents[3]


def test_rayservice_points_at_the_policy_app_with_valid_args(tmp_path):
    pytest.importorskip("ray.serve")
    doc = yaml.safe_load((ROOT / "infra/kuberay/rayservice-policy.yaml").read_text())
    assert doc["kind"] == "RayService" and doc["spec"]["rayClusterConfig"]["rayVersion"] == "2.60.0"
    serve_cfg = yaml.safe_load(doc["spec"]["serveConfigV2"])
    (application,) = serve_cfg["applications"]
    module, _, name = application["import_path"].partition(":")
    builder = getattr(importlib.import_module(module), name)
    args = application["args"]
    assert args["ref"].startswith("registry:") and args["ref"].endswith("@champion")  # follows promotions
    known = set(ServeConfig.__dataclass_fields__) | {"replicas", "replicas_per_node", "token_file"}
    assert set(args) <= known, set(args) - known
    mounts = [m["mountPath"] for g in doc["spec"]["rayClusterConfig"]["workerGroupSpecs"]
              for c in g["template"]["spec"]["containers"] for m in c.get("volumeMounts", [])]
    assert str(Path(args["token_file"]).parent) in mounts  # the token comes from a mounted Secret, not an arg
    with pytest.raises(ValueError, match="unknown \\['prot'\\]"):
        builder({"ref": "x", "prot": 1})
