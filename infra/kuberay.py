"""The KubeRay manifests (RayCluster and RayJob for `roboloop rl`, RayService for the policy server), from one source.

    python infra/kuberay.py --check    # the files in infra/kuberay/ are what this renders (a test runs it)
    python infra/kuberay.py --write    # after changing this file

One image, one Ray version (the installed one's), one way to reach S3 (the `roboloop-s3` Secret as environment, as
the gpu pool's pods get it), and Ray's token authentication on every Ray process (Ray 2.60 turns it on for a
cluster: a worker without the head's token cannot join, which the test hosts showed; the token comes from the
`roboloop-ray-auth` Secret). `validate` checks every pod template strictly against the Kubernetes API schema (as a
core/v1 PodTemplate; kubernetes-validate, offline, 1.29 and 1.37). The KubeRay resources' own fields (rayStartParams,
groups, serveConfigV2) have no offline schema: they are checked by tests/unit/test_kuberay_manifests.py, not by a
schema.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
OUT = HERE / "kuberay"
IMAGE = "ghcr.io/roboloop/roboloop-gpu:latest"  # infra/Dockerfile.gpu
REGISTRY = "s3://roboloop/registry"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SECRETS = "kubectl create secret generic roboloop-s3 --from-literal=AWS_ACCESS_KEY_ID=... " \
          "--from-literal=AWS_SECRET_ACCESS_KEY=... [--from-literal=ROBOLOOP_S3_ENDPOINT_URL=...]\n" \
          "kubectl create secret generic roboloop-ray-auth --from-literal=token=$(openssl rand -hex 32)"


def ray_version() -> str:
    import ray

    return ray.__version__


def container(name: str, cpu: str, memory: str, gpus: int = 0, ports: list | None = None,
              mounts: list | None = None) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    c: dict[str, Any] = {
        "name": name, "image": IMAGE,
        "env": [{"name": "ROBOLOOP_REGISTRY", "value": REGISTRY},
                {"name": "ISAACSIM_ASSET_ROOT", "value": "/opt/roboloop/assets"},
                {"name": "RAY_AUTH_MODE", "value": "token"},
                {"name": "RAY_AUTH_TOKEN",
                 "valueFrom": {"secretKeyRef": {"name": "roboloop-ray-auth", "key": "token"}}}],
        "envFrom": [{"secretRef": {"name": "roboloop-s3"}}],
        "resources": {"requests": res, "limits": res}}
    if ports:
        c["ports"] = ports
    if mounts:
        c["volumeMounts"] = mounts
    return c


def pod(c: dict, volumes: list | None = None, gpu: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [c]}
    if volumes:
        spec["volumes"] = volumes
    if gpu:
        spec["tolerations"] = [GPU_TOLERATION]
    return {"spec": spec}


def cluster(head_ports: list, groups: list[dict]) -> dict[str, Any]:
    return {"rayVersion": ray_version(),
            "headGroupSpec": {"rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                              "template": pod(container("ray-head", "2", "8Gi", ports=head_ports))},
            "workerGroupSpecs": groups}


def group(name: str, replicas: int, c: dict, volumes: list | None = None, max_replicas: int | None = None) -> dict:
    g = {"groupName": name, "replicas": replicas, "minReplicas": 0, "maxReplicas": max_replicas or replicas,
         "rayStartParams": {}, "template": pod(c, volumes, gpu="nvidia.com/gpu" in c["resources"]["limits"])}
    return g


ARTIFACTS = ([{"name": "artifacts", "persistentVolumeClaim": {"claimName": "roboloop-artifacts"}}],
             [{"name": "artifacts", "mountPath": "/work/artifacts"}])  # RL's checkpoints and published model
GCS_PORTS = [{"containerPort": 6379, "name": "gcs"}, {"containerPort": 8265, "name": "dashboard"}]


def rl_groups(cpu_workers: int) -> list[dict]:
    vols, mounts = ARTIFACTS
    return [group("gpu", 1, container("ray-worker", "8", "48Gi", gpus=1, mounts=mounts), vols, max_replicas=4),
            group("cpu", cpu_workers, container("ray-worker", "4", "16Gi"), max_replicas=16)]


def raycluster() -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "roboloop-rl", "labels": {"app": "roboloop", "component": "rl"}},
            "spec": {**cluster([*GCS_PORTS, {"containerPort": 10001, "name": "client"}], rl_groups(2)),
                     "enableInTreeAutoscaling": True}}


def rayjob() -> dict[str, Any]:
    entry = ("roboloop rl --policy registry:reach-vla@champion --task Roboloop-Reach-Color-v0 --mode async "
             "--env-steps 200000 --env-workers 8 --envs-per-worker 32 --learner-device cuda --placement spread "
             "--ray-address auto --output-dir /work/artifacts/rl/reach-async")
    vols, mounts = ARTIFACTS
    return {"apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": "roboloop-rl-finetune", "labels": {"app": "roboloop", "component": "rl"}},
            "spec": {"entrypoint": entry, "shutdownAfterJobFinishes": True, "ttlSecondsAfterFinished": 600,
                     "activeDeadlineSeconds": 14400,
                     "submitterPodTemplate": {"spec": {"restartPolicy": "Never",
                                                       "containers": [container("submitter", "1", "2Gi")]}},
                     "rayClusterSpec": cluster(GCS_PORTS, rl_groups(8))}}


def rayservice() -> dict[str, Any]:
    serve = {"http_options": {"host": "0.0.0.0", "port": 8000},
             "applications": [{"name": "roboloop-policy", "route_prefix": "/",
                               "import_path": "roboloop.serving.ray_serve:app",
                               "args": {"ref": "registry:reach-vla@champion", "replicas": 2, "replicas_per_node": 1,
                                        "max_batch": 64, "max_wait_ms": 2.0, "device": "cuda",
                                        "token_file": "/var/run/roboloop/serve-token",
                                        "cache": "/tmp/roboloop-serve-cache"}}]}
    token = ([{"name": "serve-token", "secret": {"secretName": "roboloop-serve-token", "defaultMode": 0o400}}],
             [{"name": "serve-token", "mountPath": "/var/run/roboloop", "readOnly": True}])
    gpu = group("gpu", 2, container("ray-worker", "4", "16Gi", gpus=1, mounts=token[1]), token[0], max_replicas=8)
    gpu["minReplicas"] = 1
    return {"apiVersion": "ray.io/v1", "kind": "RayService",
            "metadata": {"name": "roboloop-policy", "labels": {"app": "roboloop", "component": "serve"}},
            "spec": {"serveConfigV2": yaml.safe_dump(serve, sort_keys=False),
                     "rayClusterConfig": cluster([*GCS_PORTS, {"containerPort": 8000, "name": "serve"}], [gpu])}}


HEADERS = {
    "raycluster.yaml": "A long-lived Ray cluster for `roboloop rl` (KubeRay operator >= 1.2). Learner and rollout "
                       "workers go to the\nGPU group, Isaac Lab environment workers to the CPU group. A flow run of "
                       "rl-finetune with\nrl.ray_address=ray://roboloop-rl-head-svc:10001 is its client.",
    "rayjob.yaml": "One RL fine-tuning as a RayJob: KubeRay creates a cluster, runs the driver in it and deletes the "
                   "cluster\nwhen the job ends.",
    "rayservice-policy.yaml": "The policy server on a cluster: roboloop.serving.ray_serve:app (the code of `roboloop "
                              "serve --engine ray`),\none replica per node, each following the registry's champion.\n"
                              "kubectl create secret generic roboloop-serve-token "
                              "--from-file=serve-token=.roboloop/serve-token",
}
BUILDERS = {"raycluster.yaml": raycluster, "rayjob.yaml": rayjob, "rayservice-policy.yaml": rayservice}


def render() -> dict[str, str]:
    out = {}
    for name, build in BUILDERS.items():
        head = "\n".join(f"# {line}" for line in [*HEADERS[name].splitlines(), *SECRETS.splitlines(),
                                                   f"kubectl apply -f infra/kuberay/{name}",
                                                   "Rendered by infra/kuberay.py: edit that, then --write."])
        out[name] = head + "\n" + yaml.safe_dump(build(), sort_keys=False, width=120)
    return out


def pod_templates(doc: dict) -> list[dict]:
    spec = doc["spec"]
    ray = spec.get("rayClusterSpec") or spec.get("rayClusterConfig") or spec
    found = [ray["headGroupSpec"]["template"], *(g["template"] for g in ray["workerGroupSpecs"])]
    return found + ([spec["submitterPodTemplate"]] if "submitterPodTemplate" in spec else [])


def validate(doc: dict, version: str) -> list[str]:
    """Schema errors of `doc`'s pod templates (strict, as core/v1 PodTemplates)."""
    import kubernetes_validate

    errors = []
    for i, tpl in enumerate(pod_templates(doc)):
        try:
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"t{i}"},
                                          "template": tpl}, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{doc['kind']} pod template {i} {'.'.join(map(str, e.path))}: {e.message}")
    return errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true")
    p.add_argument("--check", action="store_true")
    args = p.parse_args(argv)
    rendered = render()
    stale = [n for n, text in rendered.items() if not (OUT / n).is_file() or (OUT / n).read_text() != text]
    if args.write:
        for n in stale:
            (OUT / n).write_text(rendered[n])
        print(f"wrote {', '.join(stale) or 'nothing (up to date)'}")
        return 0
    if stale:
        print(f"infra/kuberay/{', '.join(stale)}: not what infra/kuberay.py renders (run it with --write)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
