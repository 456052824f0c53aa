"""The gpu pool's indexed training Job, run as Kubernetes runs it: `roboloop cluster render k8s` prints the Job
(rendered by prefect-kubernetes's code, validated against the Kubernetes schema); each pod's container command
then runs on a test host of its own, with exactly the environment, host name and DNS names the manifest gives
pod i (infra/k8s.py's `pod`: downward API, secrets, `$(VAR)`), and a disk of its own. The pods share nothing but
the S3 store.

- Two pods of one rank each train as two ranks on one host (same global batch and seed): the same losses.
- Every pod of a Job is killed (kill -9) after checkpoints reached S3; the Job re-created (a new name, empty
  disks) resumes from the store and ends with the same weights, bit for bit, as a Job that was never
  interrupted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from tests.cluster import services
from tests.cluster.conftest import k8s

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
STEPS, EVERY = 30, 5
SECRETS = {"roboloop-prefect-auth": {"auth-string": "admin:unused"},
           "roboloop-s3": {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "ROBOLOOP_S3_ENDPOINT_URL": f"http://store:{services.S3_PORT}"}}
TRAIN = ["--steps", str(STEPS), "--checkpoint-every-steps", str(EVERY), "--lr", "0.002", "--warmup-steps", "3",
         "--max-tokens", "512", "--num-workers", "1", "--device", "cpu", "--model-overrides",
         json.dumps({"image_size": [32, 32], "horizon": 8})]


def _render(output: str) -> dict:
    command = " ".join(["roboloop", "train", "--dataset", "s3://team/datasets/pick", "--output-dir",
                        f"artifacts/models/{output}", *[f"'{a}'" if a.startswith("{") else a for a in TRAIN]])
    r = subprocess.run([PY, "-m", "roboloop.cli", "cluster", "render", "k8s", "--nnodes", "2", "--gpus", "1",
                        "--json", "--command", command, "--set", "run_store=s3://team/runs",
                        "--set", "collective_timeout_s=60", "--set", 'env={"ROBOLOOP_JOIN_TIMEOUT_S": "240"}'],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[0])


def _run_job(hosts, job: dict, name: str, work: Path) -> list[subprocess.Popen]:
    """Pod i of the Job `name` on node-i: its host name and DNS names, its environment, its own disk."""
    procs = []
    for i, host in enumerate(["node-0", "node-1"]):
        pod = k8s.pod(job, name, i, SECRETS)
        hosts.name(host, pod["hostname"], *pod["dns"][1:])
        disk = work / "disks" / pod["hostname"]
        disk.mkdir(parents=True)
        image = {"PATH": f"{Path(PY).parent}:/usr/bin:/bin", "HOME": str(disk), "OMP_NUM_THREADS": "1",
                 "GLOO_SOCKET_IFNAME": "eth0", "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"}  # the image's own
        cmd = [c.replace("/opt/roboloop", str(ROOT)) for c in pod["command"]]  # the image's WORKDIR is the repo
        with open(work / f"{pod['hostname']}.log", "w") as log:
            procs.append(hosts.popen(host, cmd, cwd=disk, env={**image, **pod["env"]}, stdout=log,
                                     stderr=subprocess.STDOUT))
    return procs


def _wait(procs: list[subprocess.Popen], work: Path) -> None:
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(600))
        except subprocess.TimeoutExpired:
            codes.append(None)
    logs = "\n".join(f"== {f.name}\n{f.read_text()[-2500:]}" for f in sorted(work.glob("*.log")))
    assert codes == [0, 0], f"pods exited {codes}:\n{logs}"


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("hosts", [["store", "node-0", "node-1"]], indirect=True)
def test_the_indexed_job_trains_across_hosts_and_a_recreated_job_resumes_from_s3(hosts, work):
    v3 = services.dataset_in_s3(hosts, work)
    ref = work / "one-host"  # the reference: two ranks on one host, the dataset on its disk
    r = hosts.run("node-0", [PY, "-m", "roboloop.cli", "train", "--dataset", str(v3), "--output-dir", str(ref),
                             "--nproc-per-node", "2", *TRAIN], env={**os.environ, "OMP_NUM_THREADS": "1"},
                  timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]

    job = _render("pick-a")
    a = job["metadata"]["generateName"] + "a1b2c"  # the name the API server completes generateName with
    _wait(_run_job(hosts, job, a, work), work)
    disk0, disk1 = work / "disks" / f"{a}-0", work / "disks" / f"{a}-1"
    one, two = _losses(ref), _losses(disk0 / "artifacts/models/pick-a")
    assert len(one) == len(two) == STEPS
    assert max(abs(x - y) for x, y in zip(one, two, strict=True)) <= 1e-5, (one[-3:], two[-3:])
    assert not list(disk1.rglob("model.safetensors"))  # node 1 writes no model
    assert list((disk1 / ".roboloop/cache/datasets").glob("*/meta/info.json"))  # its dataset came from S3
    keys = services.s3_keys(hosts)
    assert any(k.startswith("runs/models/pick-a-") and k.endswith("/model.safetensors") for k in keys), keys

    job = _render("pick-b")  # the same training, a run of its own: interrupted, then its Job re-created
    b = job["metadata"]["generateName"] + "d3e4f"
    procs = _run_job(hosts, job, b, work)
    second = work / "disks" / f"{b}-0/artifacts/models/pick-b/checkpoints/step-{2 * EVERY:08d}/meta.json"
    deadline = time.time() + 600
    while not second.exists():  # once the second checkpoint is written, the first one is in S3
        assert time.time() < deadline and all(p.poll() is None for p in procs), "job B never reached 2 checkpoints"
        time.sleep(0.05)
    assert hosts.kill("node-0") and hosts.kill("node-1")  # both machines lost at once
    for p in procs:
        p.wait(30)
    keys = services.s3_keys(hosts)
    assert not any(k.startswith("runs/models/pick-b-") and k.endswith("/model.safetensors") for k in keys)
    c = job["metadata"]["generateName"] + "g5h6i"  # re-created: a new name, new pods, empty disks
    _wait(_run_job(hosts, job, c, work), work)
    log = (work / f"{c}-0.log").read_text()
    resumed = [json.loads(line)["resumed_from"] for line in log.splitlines() if '"resumed_from"' in line]
    assert resumed and resumed[0] >= EVERY, log[-2000:]
    final_a = load_file(disk0 / "artifacts/models/pick-a/model.safetensors")
    final_c = load_file(work / "disks" / f"{c}-0/artifacts/models/pick-b/model.safetensors")
    assert final_a.keys() == final_c.keys()
    assert all((final_a[k] == final_c[k]).all() for k in final_a)  # bit for bit: nothing lost, nothing repeated
