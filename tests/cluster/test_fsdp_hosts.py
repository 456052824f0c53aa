"""FSDP2 across two test hosts that share nothing but the S3 run store (node 0: `roboloop train --strategy fsdp`,
node 1: `roboloop cluster join`): each node writes its own ranks' shards, the checkpoint becomes whole in the store
(every node's part, then node 0's meta.json listing them all); the run trains as one process accumulating two
micro-batches does (the same packs); and a job re-created on one host with fresh disks (the model lost before it
reached the store) resumes the two hosts' checkpoint on one rank, resharded, and goes on with the same loss curve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster import services
from tests.cluster.services import S3_ENV

pytestmark = pytest.mark.slow
PY = sys.executable
STEPS, EVERY = 16, 8
TRAIN = ["--steps", str(STEPS), "--checkpoint-every-steps", str(EVERY), "--lr", "0.002", "--warmup-steps", "3",
         "--max-tokens", "512", "--num-workers", "1", "--device", "cpu", "--strategy", "fsdp", "--model-overrides",
         json.dumps({"image_size": [32, 32], "horizon": 8})]
_DROP_MODEL = """
from roboloop.s3 import client
s3 = client()
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="team", Prefix="runs/models/")["Contents"]]
for k in keys:
    if k.endswith("/model.safetensors"):
        s3.delete_object(Bucket="team", Key=k)
print(len(keys))
"""


def _start(hosts, work: Path, run: str, nodes: list[str], *extra: str, nproc: int = 1) -> list[subprocess.Popen]:
    train = ["roboloop", "train", "--dataset", "s3://team/datasets/pick", "--output-dir", "artifacts/models/fsdp",
             *TRAIN, *extra]
    return services.start_nodes(hosts, work, run, {host: train if i == 0 else ["roboloop", "cluster", "join"]
                                                   for i, host in enumerate(nodes)}, nproc=nproc)


def _finish(procs, work: Path, run: str) -> None:
    codes = [p.wait(900) for p in procs]
    logs = "\n".join(f"== {f.name}\n{f.read_text()[-3000:]}" for f in sorted((work / run).glob("*.log")))
    assert codes == [0] * len(procs), f"{run}: exited {codes}\n{logs}"


def _rows(work: Path, run: str, host: str, output: str = "fsdp") -> list[dict]:
    path = work / run / host / f"artifacts/models/{output}/metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _close(a: list[float], b: list[float], rel: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(x) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("hosts", [["store", "node-0", "node-1", "node-2"]], indirect=True)
def test_fsdp_across_two_hosts_meets_in_the_store_and_resumes_resharded(hosts, work):
    services.dataset_in_s3(hosts, work)
    _finish(_start(hosts, work, "two", ["node-0", "node-1"]), work, "two")
    keys = services.s3_keys(hosts)
    step = f"checkpoints/step-{EVERY:08d}/"
    mine = sorted(k.split(step)[1] for k in keys if step in k)
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "extra.pt", "meta.json"} <= set(mine), mine  # both nodes'
    assert not (work / "two" / "node-1" / "artifacts/models/fsdp/checkpoints" / f"step-{EVERY:08d}" /
                "__0_0.distcp").exists()  # each node wrote its own shards only: they met in the store
    two = [r["loss"] for r in _rows(work, "two", "node-0")]
    assert _rows(work, "two", "node-0")[0]["run"]["gradients"] == {"reduce_dtype": "fp32", "accumulate": 1, "ranks": 2}

    # one process, accumulating two micro-batches: the packs of two ranks, the same losses
    _finish(_start(hosts, work, "one", ["node-2"], "--accumulate", "2", "--output-dir", "artifacts/models/one"),
            work, "one")
    one = [json.loads(line)["loss"] for line in
           (work / "one" / "node-2" / "artifacts/models/one/metrics.jsonl").read_text().splitlines()]
    assert _close(one, two, 1e-4), (one, two)

    # the job re-created on one host, fresh disks, its model lost before it reached the store: it resumes the two
    # hosts' checkpoint on one rank (DCP reshards) and goes on as the two hosts went
    drop = hosts.run("node-0", [PY, "-c", _DROP_MODEL], env={**os.environ, **S3_ENV}, timeout=60)
    assert drop.returncode == 0, drop.stderr
    _finish(_start(hosts, work, "again", ["node-2"], "--accumulate", "2"), work, "again")
    log = (work / "again" / "node-2.log").read_text()
    assert '"resumed_from": 8' in log, log[-3000:]
    again = [r["loss"] for r in _rows(work, "again", "node-2")]
    assert _close(again[EVERY:], two[EVERY:], 1e-4), (again, two)

    # HSDP on 2 hosts x 2 ranks (sharded within each host, replicated across them) trains as one process that
    # accumulates the four ranks' micro-batches
    _finish(_start(hosts, work, "hsdp", ["node-0", "node-1"], "--strategy", "hsdp", "--output-dir",
                   "artifacts/models/hsdp", nproc=2), work, "hsdp")
    _finish(_start(hosts, work, "four", ["node-2"], "--accumulate", "4", "--output-dir", "artifacts/models/four"),
            work, "four")
    hsdp, four = _rows(work, "hsdp", "node-0", "hsdp"), _rows(work, "four", "node-2", "four")
    assert hsdp[0]["run"]["gradients"]["ranks"] == 4
    assert _close([r["loss"] for r in four], [r["loss"] for r in hsdp], 1e-4), (four, hsdp)
    assert any("hsdp-" in k and k.endswith(f"step-{EVERY:08d}/meta.json") for k in services.s3_keys(hosts))
