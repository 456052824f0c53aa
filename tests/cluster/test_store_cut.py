"""The store's cable pulled while rank 0 pushes a checkpoint to it: the push fails within the S3 timeouts, the
checkpoint it was writing is never listed (its meta.json, the last object, never arrived; a multipart upload cut short
is no object at all), so resuming takes the previous whole one; and a checkpoint whose bytes changed in the store is
refused when fetched, naming the file."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.cluster import services
from tests.cluster.services import S3_ENV

pytestmark = pytest.mark.slow
PY = sys.executable
ENV = {**S3_ENV, "ROBOLOOP_S3_CONNECT_TIMEOUT_S": "2", "ROBOLOOP_S3_READ_TIMEOUT_S": "3",
       "ROBOLOOP_S3_MAX_ATTEMPTS": "2"}
PUSH = """
import sys, torch
from pathlib import Path
from roboloop.s3 import client
from roboloop.training import checkpoint
from roboloop.training.runstore import Mirror
client().create_bucket(Bucket="team")
m, ckpts = Mirror("s3://team/runs/models/run-1"), Path(sys.argv[1]) / "checkpoints"
m.push_checkpoint(checkpoint.save(ckpts, 5, {"w": torch.ones(1000)}, keep_last=5), keep_last=5)
big = checkpoint.save(ckpts, 10, {"w": torch.zeros(60_000_000)}, keep_last=5)  # 240 MB: a multipart upload
print("pushing", flush=True)
m.push_checkpoint(big, keep_last=5)
print("pushed", flush=True)
"""
AFTER = """
import sys
from pathlib import Path
from roboloop.errors import CorruptFileError
from roboloop.s3 import client
from roboloop.training.runstore import Mirror
m, fresh = Mirror("s3://team/runs/models/run-1"), Path(sys.argv[1]) / "fresh"
print("steps", m.checkpoint_steps())
print("pulled", m.pull_checkpoint(5, fresh).name)
client().put_object(Bucket="team", Key="runs/models/run-1/checkpoints/step-00000005/state.pt", Body=b"cut short")
try:
    m.pull_checkpoint(5, Path(sys.argv[1]) / "fresh2")
except CorruptFileError as e:
    print("refused", e)
"""


@pytest.mark.parametrize("hosts", [["store", "node-0"]], indirect=True)
def test_a_store_cut_during_a_checkpoint_push_leaves_nothing_that_resumes(hosts, work):
    services.moto(hosts, "store", work)
    env = {**os.environ, **ENV}
    with open(work / "push.log", "w") as log:
        push = hosts.popen("node-0", [PY, "-c", PUSH, str(work)], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while "pushing" not in (work / "push.log").read_text():
        assert push.poll() is None and time.time() < deadline, (work / "push.log").read_text()
        time.sleep(0.05)
    time.sleep(0.3)  # the upload under way
    hosts.cut("store")
    t0 = time.time()
    code = push.wait(120)
    text = (work / "push.log").read_text()
    assert code != 0 and "pushed" not in text, text[-2000:]
    assert time.time() - t0 < 60, text[-2000:]  # bounded by the S3 timeouts and attempts
    hosts.mend("store")
    r = hosts.run("node-0", [PY, "-c", AFTER, str(work)], env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "steps [5]", lines  # the cut checkpoint was never made whole: nobody resumes from it
    assert lines[1] == "pulled step-00000005"
    assert lines[2].startswith("refused checkpoint step-00000005") and "state.pt" in lines[2], lines
