"""The gpu pool's Kubernetes manifests as the work pool submits them (rendered by prefect-kubernetes's own code),
checked against the Kubernetes API schema and against each other: the rendezvous name each pod is given is pod
0's DNS name under the headless service that selects the Job's pods, every pod gets its rank, and nothing is
shared but S3."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("roboloop_k8s", ROOT / "infra" / "k8s.py")
k8s = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(k8s)
SECRETS = {"roboloop-prefect-auth": {"auth-string": "admin:pw"},
           "roboloop-s3": {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                           "ROBOLOOP_S3_ENDPOINT_URL": "http://minio.storage:9000"}}


@pytest.fixture(scope="module")
def manifests():
    return k8s.render({"nnodes": 3, "gpus": 2, "name": "nightly", "run_store": "s3://team/runs"})


def test_the_job_and_service_validate_against_the_oldest_and_newest_kubernetes(manifests):
    job, svc = manifests
    assert [d["kind"] for d in manifests] == ["Job", "Service"]
    for version in k8s.K8S_VERSIONS:
        assert k8s.validate(job, version) == [] and k8s.validate(svc, version) == []
    # the validator can fail: what the old template rendered (numbers as env values), and an unknown field
    bad = copy.deepcopy(job)
    bad["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "ROBOLOOP_NNODES", "value": 3})
    assert "is not of type 'string'" in k8s.validate(bad, "1.29.0")[0]
    bad = copy.deepcopy(job)
    bad["spec"]["template"]["spec"]["sharedOutput"] = "/shared"
    assert "'sharedOutput' was unexpected" in k8s.validate(bad, "1.37.0")[0]


def test_each_pod_finds_rank_zero_by_the_name_the_service_gives_it(manifests):
    job, svc = manifests
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 3
    assert "generateName" in job["metadata"] and "name" not in job["metadata"]  # the API picks the name
    pod_labels = spec["template"]["metadata"]["labels"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"].items() <= pod_labels.items()  # the service selects this Job's pods
    assert spec["template"]["spec"]["subdomain"] == svc["metadata"]["name"]
    name = job["metadata"]["generateName"] + "x7k2q"  # as the API server completes generateName
    pods = [k8s.pod(job, name, i, SECRETS) for i in range(3)]
    for i, p in enumerate(pods):
        env = p["env"]
        assert env["ROBOLOOP_NODE_RANK"] == env["JOB_COMPLETION_INDEX"] == str(i)
        assert env["ROBOLOOP_RUN_ID"] == name  # one rendezvous id per Job, the same on every pod
        host, port = env["ROBOLOOP_RDZV_ENDPOINT"].rsplit(":", 1)
        assert host in pods[0]["dns"] and host != pods[0]["hostname"] and port == "29500"
        assert (env["ROBOLOOP_NNODES"], env["ROBOLOOP_NPROC_PER_NODE"]) == ("3", "2")
        assert env["ROBOLOOP_RUN_STORE"] == "s3://team/runs"
        assert env["ROBOLOOP_S3_ENDPOINT_URL"] == "http://minio.storage:9000"  # from the S3 secret
        assert p["command"][0] == "/opt/roboloop/infra/k8s-entrypoint.sh"
    assert pods[1]["hostname"] == f"{name}-1"
    volumes = spec["template"]["spec"]["volumes"]
    assert [v["name"] for v in volumes] == ["dshm"] and "emptyDir" in volumes[0]  # no shared volume


def test_render_command_prints_validated_yaml_and_refuses_unknown_variables():
    r = subprocess.run([sys.executable, "-m", "roboloop.cli", "cluster", "render", "k8s", "--nnodes", "2", "--gpus",
                        "4", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    job, svc = (json.loads(line) for line in r.stdout.splitlines())
    assert job["spec"]["completions"] == 2 and svc["kind"] == "Service"
    assert "validated against Kubernetes 1.29.0 and 1.37.0" in r.stderr
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert not any(k.startswith("PREFECT_HOME") for k in env)  # this machine's Prefect settings stay out
    r = subprocess.run([sys.executable, "-m", "roboloop.cli", "cluster", "render", "k8s", "--set", "shared_output=/x"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode != 0 and "shared_output: not variables of k8s-gpu-pool.json" in r.stderr
