"""The GPU pool's Kubernetes manifests, as the work pool submits them: rendered, validated, and made into pods.

    python infra/k8s.py render --nnodes 2 --gpus 8 [--set run_store=s3://b/runs ...]   # YAML: the Job + Service
    roboloop cluster render k8s --nnodes 2 --gpus 8                                     # the same

`render` fills `infra/k8s-gpu-pool.json` (the `gpu` pool's base job template) with prefect-kubernetes's own code:
`KubernetesWorkerJobConfiguration.from_template_and_values` and `prepare_for_flow_run`, as the worker does for a
flow run (here a flow run made up for the purpose; no server is asked). The Service is the headless one the pods'
`subdomain` names (`<job>-<i>.roboloop-ranks` is pod i's DNS name; rank 0 of the rendezvous is `<job>-0`).

`validate` checks manifests against the Kubernetes API's own schema (kubernetes-validate, offline, strict: unknown
fields are errors) for the oldest and the newest version roboloop claims. prefect-kubernetes 0.8 requires
`parallelism: 1` and `completions: 1` inside the pod spec, where Kubernetes has no such fields (the API server drops
them with a warning); they are the only errors strict validation may report, and `validate` names them apart.

`pods` is what the Job controller and the kubelet make of the Job for completion index i: the pod's labels and
annotations, its host name and DNS names, and its container's environment (downward API fields, secrets,
`$(VAR)` references, resolved in Kubernetes's order). tests/cluster runs each pod's command on a test host of its
own with exactly that.

This file sits beside the template, not in the library: it imports Prefect, which roboloop/ never does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "k8s-gpu-pool.json"
SERVICE = "roboloop-ranks"  # the headless service; the pod template's subdomain
RANK_LABEL = "roboloop/train-rank"
K8S_VERSIONS = ("1.29.0", "1.37.0")  # the oldest and the newest Kubernetes minor versions claimed
PREFECT_POD_SPEC_FIELDS = ("parallelism", "completions")  # prefect-kubernetes 0.8 insists on them in the pod spec


def service(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "roboloop"}},
            "spec": {"clusterIP": "None", "selector": {RANK_LABEL: "true"}, "publishNotReadyAddresses": True,
                     "ports": [{"name": "rdzv", "port": 29500, "targetPort": 29500}]}}


class _NoServer:
    """The client `from_template_and_values` would ask about block and variable references: our template has
    none, so it is never called; a template that gains one fails here, by name, instead of starting a server."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"the job template references Prefect blocks or variables ({name}); render it on a worker")


def render(values: dict[str, Any], flow_run_name: str = "nightly-retrain") -> list[dict[str, Any]]:
    """[Job, Service] as the gpu pool's worker would submit them for a flow run, with job variables `values`."""
    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    template = json.loads(TEMPLATE.read_text())

    async def build() -> Any:
        cfg = await KubernetesWorkerJobConfiguration.from_template_and_values(template, values,
                                                                            client=_NoServer())  # type: ignore[arg-type]
        cfg.prepare_for_flow_run(FlowRun(id=uuid.uuid4(), name=flow_run_name, flow_id=uuid.uuid4()))
        return cfg

    job = asyncio.run(build()).job_manifest
    return [job, service(job["metadata"]["namespace"])]


def validate(manifest: dict[str, Any], version: str) -> list[str]:
    """Kubernetes `version`'s schema errors of `manifest` (strict), prefect-kubernetes's pod-spec fields apart."""
    import kubernetes_validate

    pod_spec = manifest.get("spec", {}).get("template", {}).get("spec", {})
    known = {k: pod_spec.pop(k) for k in PREFECT_POD_SPEC_FIELDS if k in pod_spec} if manifest["kind"] == "Job" \
        else {}
    try:
        kubernetes_validate.validate(manifest, version, strict=True)
        return []
    except kubernetes_validate.ValidationError as e:
        return [f"{manifest['kind']} {'.'.join(map(str, e.path))}: {e.message}"]
    finally:
        pod_spec.update(known)


# ---------------------------------------------------------------- what a Job becomes: its pods
def pod(job: dict[str, Any], job_name: str, index: int, secrets: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Pod `index` of `job` (created as `job_name`): host name, DNS names, labels and its container's environment and
    command, as the Job controller and the kubelet make them (batch/v1 Indexed completion)."""
    tpl = job["spec"]["template"]
    labels = {**tpl.get("metadata", {}).get("labels", {}), "batch.kubernetes.io/job-name": job_name,
              "job-name": job_name, "batch.kubernetes.io/job-completion-index": str(index)}
    annotations = {**tpl.get("metadata", {}).get("annotations", {}),
                   "batch.kubernetes.io/job-completion-index": str(index)}
    ns = job["metadata"]["namespace"]
    meta = {"name": f"{job_name}-{index}-x", "namespace": ns, "labels": labels, "annotations": annotations}
    spec = tpl["spec"]
    hostname, sub = f"{job_name}-{index}", spec.get("subdomain")
    dns = [hostname, *([f"{hostname}.{sub}", f"{hostname}.{sub}.{ns}.svc.cluster.local"] if sub else [])]
    (container,) = spec["containers"]
    env: dict[str, str] = {"JOB_COMPLETION_INDEX": str(index)}  # the Job controller injects it
    for src in container.get("envFrom", []):
        env.update(secrets[src["secretRef"]["name"]])
    for item in container.get("env", []):
        env[item["name"]] = _env_value(item, meta, env, secrets)
    command = [_expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]]
    return {"hostname": hostname, "dns": dns, "env": env, "command": command, "labels": labels}


def _env_value(item: dict[str, Any], meta: dict[str, Any], env: dict[str, str],
               secrets: dict[str, dict[str, str]]) -> str:
    if "value" in item:
        if not isinstance(item["value"], str):
            raise ValueError(f"env {item['name']}: value {item['value']!r} is not a string (the API refuses it)")
        return _expand(item["value"], env)
    src = item["valueFrom"]
    if "secretKeyRef" in src:
        ref = src["secretKeyRef"]
        return secrets[ref["name"]][ref["key"]]
    path = src["fieldRef"]["fieldPath"]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        found = meta[m.group(1)].get(m.group(2))
        if found is None:
            raise ValueError(f"env {item['name']}: the pod has no {m.group(1)[:-1]} {m.group(2)!r}")
        return found
    if path in ("metadata.name", "metadata.namespace"):
        return meta[path.split(".")[1]]
    raise ValueError(f"env {item['name']}: fieldPath {path!r} is not one this harness resolves")


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes's `$(VAR)`: a variable defined earlier in the list is replaced, `$$(` escapes, others stay."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


# ---------------------------------------------------------------- command line
def _values(args: argparse.Namespace) -> dict[str, Any]:
    values: dict[str, Any] = {"nnodes": args.nnodes, "gpus": args.gpus, "name": args.name}
    for k, v in (("namespace", args.namespace), ("image", args.image), ("command", args.command)):
        if v is not None:
            values[k] = v
    for kv in args.set or []:
        key, sep, raw = kv.partition("=")
        if not sep:
            raise SystemExit(f"--set {kv!r}: write NAME=VALUE (a variable of {TEMPLATE.name})")
        try:
            values[key] = json.loads(raw)
        except ValueError:
            values[key] = raw
    known = set(json.loads(TEMPLATE.read_text())["variables"]["properties"])
    unknown = sorted(set(values) - known)
    if unknown:  # refused, not ignored
        raise SystemExit(f"{', '.join(unknown)}: not variables of {TEMPLATE.name} ({', '.join(sorted(known))})")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="roboloop cluster render k8s", description="print the Job and headless Service "
                                "the gpu work pool submits for a flow run (YAML), validated against Kubernetes "
                                f"{' and '.join(K8S_VERSIONS)}")
    p.add_argument("--nnodes", type=int, default=2, help="pods (nodes) of the indexed Job")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node (ranks per pod)")
    p.add_argument("--name", default="roboloop-train", help="the Job's generateName prefix")
    p.add_argument("--namespace")
    p.add_argument("--image")
    p.add_argument("--command", help="pod 0's command (default: Prefect's flow-run command)")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", help="any other variable of the template")
    p.add_argument("--json", action="store_true", help="JSON (one document per line) instead of YAML")
    args = p.parse_args(argv)
    for k in [k for k in os.environ if k.startswith("PREFECT_") and k != "PREFECT_API_URL"]:
        del os.environ[k]  # this machine's Prefect settings are not the cluster's: they stay out of the manifest
    docs = render(_values(args))
    errors = [e for d in docs for v in K8S_VERSIONS for e in validate(d, v)]
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    if args.json:
        print("\n".join(json.dumps(d) for d in docs))
    else:
        import yaml

        print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    print(f"# validated against Kubernetes {' and '.join(K8S_VERSIONS)} (kubernetes-validate, strict)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
