"""Losing a machine in the middle of a two-host training run whose hosts share nothing but the S3 store (node 0:
`roboloop train`, node 1: `roboloop cluster join`, as the Kubernetes pods run them).

- node-1's ranks killed (kill -9) with a restart budget: both nodes' ranks restart, resume from the latest checkpoint
  and the run ends with the weights of a run that was never interrupted, bit for bit;
- node-1's cable pulled without one: node 0 fails within the collective timeout plus a bounded margin, saying a node
  was lost; retried on fresh disks (a re-created job), it resumes from the checkpoints in S3 and ends with the same
  weights;
- a pickle planted in the run store from a third host, with a meta.json whose checksums match: both nodes' ranks
  refuse it as untrusted, by name, and its command runs on neither.
"""

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
from tests.cluster.services import S3_ENV

pytestmark = pytest.mark.slow
PY = sys.executable
STEPS, EVERY, TIMEOUT = 30, 5, 15
TRAIN = ["--steps", str(STEPS), "--checkpoint-every-steps", str(EVERY), "--lr", "0.002", "--warmup-steps", "3",
         "--max-tokens", "512", "--num-workers", "1", "--device", "cpu", "--model-overrides",
         json.dumps({"image_size": [32, 32], "horizon": 8})]


def _start(hosts, work: Path, run: str, output: str, restarts: int = 0,
           node0_disk: Path | None = None) -> list[subprocess.Popen]:
    """Node 0 and node 1 of run `run`, each on its own host with a disk of its own (node 0: `node0_disk`, an earlier
    run's, as a retried job's pod that lands on the same machine)."""
    return services.start_nodes(hosts, work, run, {
        "node-0": ["roboloop", "train", "--dataset", "s3://team/datasets/pick", "--output-dir",
                   f"artifacts/models/{output}", *TRAIN],
        "node-1": ["roboloop", "cluster", "join"]}, restarts=restarts, collective_timeout_s=TIMEOUT,
        node0_disk=node0_disk)


def _logs(work: Path, run: str) -> str:
    return "\n".join(f"== {f.name}\n{f.read_text()[-2500:]}" for f in sorted((work / run).glob("*.log")))


def _finish(procs: list[subprocess.Popen], work: Path, run: str) -> None:
    codes = [p.wait(600) for p in procs]
    assert codes == [0, 0], f"{run}: exited {codes}\n{_logs(work, run)}"


def _weights(work: Path, run: str, output: str) -> dict:
    return load_file(work / run / "node-0" / "artifacts/models" / output / "model.safetensors")


def _at_checkpoint(work: Path, run: str, output: str, step: int, procs: list[subprocess.Popen]) -> None:
    marker = work / run / "node-0" / f"artifacts/models/{output}/checkpoints/step-{step:08d}/meta.json"
    deadline = time.time() + 600
    while not marker.exists():
        assert time.time() < deadline and all(p.poll() is None for p in procs), _logs(work, run)
        time.sleep(0.05)


def _resumed(work: Path, run: str) -> list[int]:
    """The step each node's ranks last started from (their result lines)."""
    lines = [line for f in (work / run).glob("*.log") for line in f.read_text().splitlines()]
    return [json.loads(line)["resumed_from"] for line in lines if line.startswith("{") and '"resumed_from"' in line]


PLANT = """
import hashlib, json, os, sys, time, torch
from pathlib import Path
from roboloop.s3 import client
from roboloop.training.runstore import Mirror

class Payload:
    def __reduce__(self):
        return os.system, (f"touch {sys.argv[2]}-$(hostname)",)

keys = [o["Key"] for o in client().list_objects_v2(Bucket="team", Prefix="runs/models/ref-")["Contents"]]
digest = keys[0].split("/")[2].removeprefix("ref-")
ckpt = Path(sys.argv[1]) / "step-00000010"
ckpt.mkdir(parents=True)
torch.save({"step": 10, "model": {"w": torch.ones(3)}, "x": Payload()}, ckpt / "state.pt")
sha = hashlib.sha256((ckpt / "state.pt").read_bytes()).hexdigest()
(ckpt / "meta.json").write_text(json.dumps({"step": 10, "time": time.time(), "files": {"state.pt": sha}}))
Mirror(f"s3://team/runs/models/planted-{digest}").push_checkpoint(ckpt, keep_last=5)
print("planted", digest)
"""


def _a_planted_checkpoint_runs_nothing(hosts, work: Path) -> None:
    """The run store is the other prefix every node reads: a checkpoint planted there (by the store's host here),
    its checksums true, used to be unpickled by both ranks (its command ran) and then called corrupt."""
    plant = hosts.run("store", [PY, "-c", PLANT, str(work / "planted-src"), str(work / "ran")],
                      env={**os.environ, **S3_ENV}, timeout=120)
    assert plant.returncode == 0, plant.stderr[-2000:]
    procs = _start(hosts, work, "planted", "planted")
    codes = [p.wait(600) for p in procs]
    logs = _logs(work, "planted")
    assert codes[0] != 0 and codes[1] != 0, logs
    assert "UntrustedFileError" in logs and "step-00000010/state.pt asks to build" in logs, logs
    assert "posix.system" in logs or "os.system" in logs, logs
    assert not list(work.glob("ran-*")), list(work.glob("ran-*"))  # its command ran on no host


DROP = """
from roboloop.s3 import client
s3 = client()
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="team", Prefix="runs/models/ref-")["Contents"]
        if "/checkpoints/" not in o["Key"]]
for k in keys:
    s3.delete_object(Bucket="team", Key=k)
print(len(keys))
"""
GET = """
import sys
from pathlib import Path
from roboloop.training.runstore import Mirror
from roboloop.s3 import client
key = next(o["Key"] for o in client().list_objects_v2(Bucket="team", Prefix="runs/models/ref-")["Contents"])
print(Mirror("s3://team/" + "/".join(key.split("/")[:3])).pull_model(Path(sys.argv[1])))
"""


def _a_model_that_never_reached_the_store_is_delivered(hosts, work: Path, reference: dict) -> None:
    """The job retried after its model never reached the store (node 0 failed at the final push, its pod back on the
    same machine): node 0 finds the model on its disk and used to exit 0 without pushing it or telling node 1,
    which waited for an hour; now it puts the model in the store and node 1 is told there is nothing to train."""
    drop = hosts.run("store", [PY, "-c", DROP], env={**os.environ, **S3_ENV}, timeout=120)
    assert drop.returncode == 0 and int(drop.stdout) >= 2, drop.stdout + drop.stderr  # the model's files, not ckpts
    t0 = time.time()
    _finish(_start(hosts, work, "ref-again", "ref", node0_disk=work / "ref" / "node-0"), work, "ref-again")
    assert time.time() - t0 < 120, _logs(work, "ref-again")  # node 1 did not wait for its join timeout
    node0, node1 = ((work / "ref-again" / f"{h}.log").read_text() for h in ("node-0", "node-1"))
    assert "model mirrored to s3://team/runs/models/ref-" in node0, node0[-3000:]
    assert "nothing to train on this node" in node1, node1[-3000:]
    got = hosts.run("node-1", [PY, "-c", GET, str(work / "delivered")], env={**os.environ, **S3_ENV}, timeout=120)
    assert got.stdout.strip() == "True", got.stdout + got.stderr
    assert _same(load_file(work / "delivered" / "model.safetensors"), reference)


def _is_rank(cmdline: bytes) -> bool:
    """A training rank (`python -m roboloop.entry train`), not torchrun, whose command line names the same module."""
    return b"roboloop.entry\x00train" in cmdline and b"torchrun" not in cmdline and b"distributed.run" not in cmdline


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


@pytest.mark.parametrize("hosts", [["store", "node-0", "node-1"]], indirect=True)
def test_losing_a_machine_mid_training(hosts, work):
    services.dataset_in_s3(hosts, work)
    _finish(_start(hosts, work, "ref", "ref"), work, "ref")  # never interrupted
    reference = _weights(work, "ref", "ref")
    _a_planted_checkpoint_runs_nothing(hosts, work)
    _a_model_that_never_reached_the_store_is_delivered(hosts, work, reference)

    # node-1's ranks die; torchrun restarts every node's ranks (one restart allowed) and they resume
    procs = _start(hosts, work, "killed", "killed", restarts=1)
    _at_checkpoint(work, "killed", "killed", 2 * EVERY, procs)
    ranks = [pid for pid in map(int, subprocess.run(["ip", "netns", "pids", hosts.ns("node-1")], capture_output=True,
                                                    text=True).stdout.split())
             if _is_rank(Path(f"/proc/{pid}/cmdline").read_bytes())]
    assert ranks
    for pid in ranks:
        os.kill(pid, 9)
    _finish(procs, work, "killed")
    assert max(_resumed(work, "killed"), default=0) >= 2 * EVERY, _logs(work, "killed")
    assert _same(_weights(work, "killed", "killed"), reference)

    # node-1's cable pulled, no restarts: node 0 fails in bounded time, naming the cause; a retry resumes from S3
    procs = _start(hosts, work, "cut", "cut")
    _at_checkpoint(work, "cut", "cut", 2 * EVERY, procs)
    hosts.cut("node-1")
    t0 = time.time()
    code = procs[0].wait(TIMEOUT + 120)
    waited = time.time() - t0
    log = (work / "cut" / "node-0.log").read_text()
    assert code != 0 and waited < TIMEOUT + 90, (code, waited, log[-2000:])
    assert "lost a node" in log, log[-2000:]
    # the lost machine itself: its torchrun waits on node 0's store, which it cannot reach (its exit barrier), until
    # the machine is gone; Kubernetes deletes a failed Job's remaining pods
    hosts.kill("node-1")
    procs[1].wait(30)
    hosts.mend("node-1")
    _finish(_start(hosts, work, "cut-retry", "cut"), work, "cut-retry")  # a re-created job: fresh disks, a new id
    assert max(_resumed(work, "cut-retry"), default=0) >= EVERY, _logs(work, "cut-retry")
    assert _same(_weights(work, "cut-retry", "cut"), reference)
