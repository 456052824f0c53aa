"""The dataset watcher: new and changed datasets are reported once, on a folder and on moto's S3 server."""

from __future__ import annotations

import uuid

from roboloop.datasets.watch import changes


def _dataset(root, name: str, rows: int = 3):
    d = root / name
    (d / "meta").mkdir(parents=True, exist_ok=True)
    (d / "meta" / "info.json").write_text('{"codebase_version": "v3.0"}')
    (d / "data").mkdir(exist_ok=True)
    (d / "data" / "file-000.parquet").write_bytes(b"x" * rows)
    return d


def test_local_folder_reports_new_and_changed_once(tmp_path):
    inbox, state = tmp_path / "inbox", tmp_path / "state.json"
    inbox.mkdir()
    assert changes(str(inbox), state) == []
    a = _dataset(inbox, "a")
    (inbox / "not-a-dataset").mkdir()
    assert changes(str(inbox), state) == [str(a)]
    assert changes(str(inbox), state) == []  # seen
    _dataset(inbox, "a", rows=5)  # a copy still growing: reported again
    b = _dataset(inbox, "b")
    assert changes(str(inbox), state) == [str(a), str(b)]
    assert sorted(p.name for p in inbox.iterdir()) == ["a", "b", "not-a-dataset"]  # nothing touched


def test_s3_prefix(tmp_path, s3_env):
    import boto3

    bucket = f"inbox-{uuid.uuid4().hex[:8]}"
    c = boto3.client("s3", endpoint_url=s3_env)
    c.create_bucket(Bucket=bucket)
    c.put_object(Bucket=bucket, Key="robots/arm1/meta/info.json", Body=b"{}")
    c.put_object(Bucket=bucket, Key="robots/arm1/data/f.parquet", Body=b"abc")
    c.put_object(Bucket=bucket, Key="robots/loose.txt", Body=b"x")
    state = tmp_path / "s.json"
    assert changes(f"s3://{bucket}/robots", state) == [f"s3://{bucket}/robots/arm1"]
    assert changes(f"s3://{bucket}/robots", state) == []
