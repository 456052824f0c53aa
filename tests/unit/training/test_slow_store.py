"""A slow run store never holds training up (roboloop.training.runstore.Pusher): two ranks checkpoint every 3 steps
into a mirror behind a store that takes about 8 s per checkpoint, with collective_timeout_s 5. Before, rank 0's next
save waited for the previous push while rank 1 waited in its collective, which timed out: the run died "having lost a
node". Now the save queues the newest checkpoint, training ends on time and the store ends with the newest ones.
On a real moto S3 server behind a throttled port."""

from __future__ import annotations

import json
import socket
import uuid

import boto3
import pytest

from roboloop.training.config import LaunchConfig, TrainConfig
from roboloop.training.launch import run_torchrun
from roboloop.training.runstore import Mirror
from tests.netdoor import Door

pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_slow_store_never_holds_up_the_ranks(tiny_v3, tmp_path, s3_env, monkeypatch):
    bucket = f"slow-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=bucket)
    door = Door(s3_env, rate=1.2e6)  # 9.4 MB checkpoints: about 8 s each
    monkeypatch.setenv("ROBOLOOP_S3_ENDPOINT_URL", door.url)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    mirror = f"s3://{bucket}/runs/models/slow"
    cfg = TrainConfig(dataset=str(tiny_v3), output_dir=str(tmp_path / "out"), steps=10, checkpoint_every_steps=3,
                      keep_last=1, num_workers=1, max_tokens=256, model_overrides={"image_size": [32, 32],
                                                                                  "horizon": 8},
                      device="cpu", mirror=mirror)
    lines: list[str] = []
    try:
        run_torchrun(cfg, LaunchConfig(nproc_per_node=2, rdzv_endpoint=f"127.0.0.1:{_port()}",
                                       collective_timeout_s=5, timeout_s=300), on_line=lines.append)
    finally:
        door.close()
    monkeypatch.setenv("ROBOLOOP_S3_ENDPOINT_URL", s3_env)  # the store itself, not the closed door
    out = "\n".join(lines)
    rows = [json.loads(r) for r in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and "lost a node" not in out, out[-3000:]
    # step 3's push was under way when step 6 and step 9 were saved: 6 was replaced in the queue by 9, which the
    # store holds at the end (keep_last 1), pushed whole; nothing waited on the store but the rank at the very end
    assert Mirror(mirror).checkpoint_steps() == [9], out[-3000:]
    local = sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir())
    assert local == ["step-00000009"], local  # pinned while pushed, pruned by a later save
