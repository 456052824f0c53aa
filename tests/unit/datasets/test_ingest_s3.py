"""S3 ingest against a real moto server on 127.0.0.1: round trip, resume, corruption, unsafe keys."""

from __future__ import annotations

import shutil
import uuid

import boto3
import pytest

from roboloop import s3 as s3mod
from roboloop.cli import main
from roboloop.datasets.ingest import ChecksumError, ingest
from roboloop.datasets.layout import UnsafePathError
from roboloop.datasets.validate import DatasetDefectError

pytestmark = pytest.mark.s3


@pytest.fixture
def bucket(s3_env):
    name = f"b-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_env).create_bucket(Bucket=name)
    return name


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()
            and not p.name.startswith(".roboloop")}


def test_round_trip_and_cache_hit(small_v21, bucket, tmp_path):
    uri = f"s3://{bucket}/datasets/small"
    assert s3mod.upload_dir(small_v21, uri) == len(_files(small_v21))
    first = ingest(uri, cache_dir=tmp_path / "cache")
    assert first.report.ok and not first.cache_hit
    assert _files(first.path) == _files(small_v21)
    assert first.bytes_downloaded == sum(len(b) for b in _files(small_v21).values())
    again = ingest(uri, cache_dir=tmp_path / "cache")
    assert again.cache_hit and again.bytes_downloaded == 0 and again.path == first.path


def test_interrupted_download_resumes(small_v21, bucket, tmp_path):
    uri = f"s3://{bucket}/ds"
    s3mod.upload_dir(small_v21, uri)
    first = ingest(uri, cache_dir=tmp_path / "a")
    total = first.bytes_downloaded
    # Leave what an interrupted run leaves: a .partial folder with some files, one half-written.
    partial = tmp_path / "b" / "datasets" / f"{first.content_hash}.partial"
    shutil.copytree(first.path, partial)
    (partial / ".roboloop-manifest.json").unlink()
    video = partial / "videos/chunk-000/observation.images.top/episode_000001.mp4"
    size = video.stat().st_size
    video.write_bytes(video.read_bytes()[: size // 2])
    (partial / "data/chunk-000/episode_000003.parquet").unlink()
    resumed = ingest(uri, cache_dir=tmp_path / "b")
    assert resumed.report.ok
    data_size = (small_v21 / "data/chunk-000/episode_000003.parquet").stat().st_size
    assert resumed.bytes_downloaded == (size - size // 2) + data_size < total
    assert _files(resumed.path) == _files(small_v21)


def test_corrupted_partial_is_detected(small_v21, bucket, tmp_path):
    uri = f"s3://{bucket}/ds"
    s3mod.upload_dir(small_v21, uri)
    first = ingest(uri, cache_dir=tmp_path / "a")
    partial = tmp_path / "b" / "datasets" / f"{first.content_hash}.partial"
    target = partial / "data/chunk-000/episode_000000.parquet"
    target.parent.mkdir(parents=True)
    good = (small_v21 / "data/chunk-000/episode_000000.parquet").read_bytes()
    target.write_bytes(b"\x00" * 100 + good[100:200])  # a flipped prefix that a resume would keep
    repaired = ingest(uri, cache_dir=tmp_path / "b")  # the resumed file fails its ETag MD5: fetched again
    assert repaired.report.ok and _files(repaired.path) == _files(small_v21)
    assert not partial.exists()


def test_cache_entry_edited_after_download_is_not_trusted(small_v21, bucket, tmp_path):
    uri = f"s3://{bucket}/ds"
    s3mod.upload_dir(small_v21, uri)
    first = ingest(uri, cache_dir=tmp_path)
    assert ingest(uri, cache_dir=tmp_path).cache_hit
    victim = first.path / "meta/episodes.jsonl"
    victim.write_text(victim.read_text().replace('"length": ', '"length": 1'))  # same file, edited
    again = ingest(uri, cache_dir=tmp_path)
    assert not again.cache_hit and again.report.ok  # re-verified, the edited file fetched again
    assert _files(again.path) == _files(small_v21)


def test_download_that_keeps_failing_its_checksum_raises(small_v21, bucket, tmp_path, monkeypatch):
    from roboloop.datasets import ingest as ingest_mod

    uri = f"s3://{bucket}/ds"
    s3mod.upload_dir(small_v21, uri)
    real = ingest_mod.verify_file

    def always_bad(path, obj):
        if obj.rel.endswith("episode_000000.parquet"):
            raise ChecksumError(f"{obj.key}: MD5 x does not match ETag {obj.etag}")
        return real(path, obj)

    monkeypatch.setattr(ingest_mod, "verify_file", always_bad)
    with pytest.raises(ChecksumError, match="does not match ETag"):
        ingest(uri, cache_dir=tmp_path)


def test_corrupted_object_is_refused(small_copy, bucket, tmp_path):
    p = small_copy / "videos/chunk-000/observation.images.wrist/episode_000004.mp4"
    p.write_bytes(p.read_bytes()[:200])  # uploaded broken: checksums agree, the content is bad
    uri = f"s3://{bucket}/broken"
    s3mod.upload_dir(small_copy, uri)
    with pytest.raises(DatasetDefectError) as err:
        ingest(uri, cache_dir=tmp_path / "c")
    assert any(d.file == "videos/chunk-000/observation.images.wrist/episode_000004.mp4"
               for d in err.value.report.defects)


def test_keys_escaping_the_prefix_are_refused(bucket, s3_env, tmp_path):
    client = boto3.client("s3", endpoint_url=s3_env)
    client.put_object(Bucket=bucket, Key="ds/meta/info.json", Body=b"{}")
    client.put_object(Bucket=bucket, Key="ds/../evil.txt", Body=b"x")
    objs = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    if "ds/../evil.txt" not in objs:
        pytest.skip("this S3 server normalises '..' in keys")
    with pytest.raises(UnsafePathError):
        ingest(f"s3://{bucket}/ds", cache_dir=tmp_path)
    assert not (tmp_path / "evil.txt").exists()


def test_cli_validate_s3(small_v21, bucket, tmp_path, capsys):
    uri = f"s3://{bucket}/cli"
    s3mod.upload_dir(small_v21, uri)
    assert main(["validate", uri, "--cache-dir", str(tmp_path)]) == 0
    assert "no defects" in capsys.readouterr().out
