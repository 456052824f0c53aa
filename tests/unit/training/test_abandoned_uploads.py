"""A writer killed mid-upload leaves a multipart upload whose parts the store keeps (and bills) until someone aborts
it. Once a checkpoint is whole in the run store nobody writes it or an older one any more: the push aborts the
unfinished uploads under them, keeps a newer checkpoint's (another node may be pushing it) and never touches another
prefix's. On a real moto S3 server."""

from __future__ import annotations

import json
import uuid

import boto3

from roboloop.training.runstore import Mirror


def _checkpoint(root, step: int):
    path = root / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "state.pt").write_bytes(b"state")
    (path / "meta.json").write_text(json.dumps({"step": step}))
    return path


def _uploads(s3, bucket: str) -> list[str]:
    return sorted(u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []))


def test_a_whole_checkpoint_aborts_the_unfinished_uploads_of_older_ones(tmp_path, s3_env):
    s3 = boto3.client("s3", endpoint_url=s3_env)
    bucket = f"up-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    ckpt = "runs/models/m-1/checkpoints/step-{:08d}/__1_0.distcp"
    for key in (ckpt.format(5), ckpt.format(15), "elsewhere/big.bin"):  # unfinished: killed, in flight, another's
        up = s3.create_multipart_upload(Bucket=bucket, Key=key)
        s3.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 1024)
    mirror = Mirror(f"s3://{bucket}/runs/models/m-1")
    mirror.push_checkpoint(_checkpoint(tmp_path, 10), keep_last=2)
    assert _uploads(s3, bucket) == ["elsewhere/big.bin", ckpt.format(15)]  # step 5's aborted
    mirror.push_checkpoint(_checkpoint(tmp_path, 20), keep_last=2)
    assert _uploads(s3, bucket) == ["elsewhere/big.bin"]  # step 15's too, once step 20 is whole
    assert mirror.checkpoint_steps() == [10, 20]
