"""The KubeRay manifests are rendered from one source (infra/kuberay.py), their pod templates pass the Kubernetes API
schema (strict, 1.29 and 1.37), and every Ray process carries the cluster's auth token (Ray 2.60 requires it of a
joining worker: tests/cluster/test_ray_hosts.py)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("roboloop_kuberay", ROOT / "infra" / "kuberay.py")
kuberay = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(kuberay)
VERSIONS = ("1.29.0", "1.37.0")


def _docs() -> dict[str, dict]:
    return {n: yaml.safe_load((ROOT / "infra/kuberay" / n).read_text()) for n in kuberay.BUILDERS}


def test_the_files_are_what_the_one_source_renders():
    assert kuberay.main(["--check"]) == 0


def test_pod_templates_pass_the_kubernetes_schema_and_the_validator_can_fail():
    for name, doc in _docs().items():
        assert len(kuberay.pod_templates(doc)) >= 2, name
        for v in VERSIONS:
            assert kuberay.validate(doc, v) == [], (name, v)
    bad = copy.deepcopy(_docs()["raycluster.yaml"])
    bad["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = [8]
    bad["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["envFromm"] = []
    errors = kuberay.validate(bad, "1.37.0")
    assert len(errors) == 2 and "'envFromm' was unexpected" in errors[0], errors


def test_every_ray_process_has_the_cluster_token_and_the_installed_ray_version():
    import ray

    for name, doc in _docs().items():
        spec = doc["spec"]
        ray_spec = spec.get("rayClusterSpec") or spec.get("rayClusterConfig") or spec
        assert ray_spec["rayVersion"] == ray.__version__, name
        for tpl in kuberay.pod_templates(doc):
            (c,) = tpl["spec"]["containers"]
            env = {e["name"]: e for e in c["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token", (name, c["name"])
            assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "roboloop-ray-auth"
            assert c["envFrom"] == [{"secretRef": {"name": "roboloop-s3"}}]  # S3 as the gpu pool's pods reach it
