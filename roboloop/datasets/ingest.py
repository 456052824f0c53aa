"""Bring a LeRobot dataset in from a local folder or S3, verified, into a content-addressed cache.

S3 sources are identified by a manifest of (key, size, ETag): its SHA-256 names the cache
folder, so an unchanged dataset is never downloaded twice and a changed one never
overwrites an older copy. Objects download in parallel into `<hash>.partial/`; a partial
file left by an interrupted run is resumed with a ranged GET. Every object's size is
checked and its MD5 compared with the ETag (single-part uploads; multipart ETags are
checked with the usual part sizes); a mismatch deletes the file and fails loudly. Only a
complete, verified download is renamed to `<hash>/`. The result is then validated.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roboloop import fsutil
from roboloop import s3 as s3mod
from roboloop.datasets.validate import DatasetDefectError, Report, validate
from roboloop.errors import BusyError
from roboloop.hashing import file_md5

log = logging.getLogger(__name__)
CHUNK = 8 * 1024 * 1024


class ChecksumError(IOError):
    """A downloaded object does not match its size or checksum."""


@dataclass
class IngestResult:
    source: str
    path: Path  # the local dataset folder
    content_hash: str  # manifest hash (S3) or DVC-style md5 of the folder listing (local)
    report: Report
    bytes_downloaded: int = 0
    cache_hit: bool = False

    def to_dict(self) -> dict:
        return {"source": self.source, "path": str(self.path), "content_hash": self.content_hash,
                "ok": self.report.ok, "num_defects": len(self.report.defects),
                "bytes_downloaded": self.bytes_downloaded, "cache_hit": self.cache_hit}


def ingest(source: str | Path, cache_dir: str | Path = ".roboloop/cache", workers: int = 8,
           strict: bool = True, deep: bool = False, settings: s3mod.S3Settings | None = None) -> IngestResult:
    """Ingest `source` (folder or s3://bucket/prefix). With `strict`, a defective dataset raises."""
    if s3mod.is_s3(source):
        result = _ingest_s3(str(source), Path(cache_dir), workers, settings)
    else:
        path = Path(source).resolve()  # a missing folder or a plain file is reported by validate below
        digest = local_manifest_hash(path) if path.is_dir() else ""
        result = IngestResult(str(source), path, digest, Report(root=str(path)))
    result.report = validate(result.path, deep=deep, workers=workers)
    if strict and not result.report.ok:
        raise DatasetDefectError(result.report)
    return result


def local_manifest_hash(root: Path) -> str:
    """Hash of (relative path, size, mtime) of every file: cheap identity of a local folder."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _ingest_s3(uri: str, cache_dir: Path, workers: int, settings: s3mod.S3Settings | None) -> IngestResult:
    with s3mod.translated(f"ingesting {uri}"):
        src = s3mod.S3Uri.parse(uri)
        client = s3mod.client(settings)
        objects = s3mod.list_objects(client, src)
        if not objects:
            raise FileNotFoundError(f"no objects under {uri}")
        manifest = [{"key": o.rel, "size": o.size, "etag": o.etag} for o in objects]
        digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
        root = cache_dir / "datasets"
        root.mkdir(parents=True, exist_ok=True)
        # Concurrent ingests of one dataset into one cache serialise here; the second finds the first's result.
        with fsutil.exclusive(root / f".{digest}.roboloop-lock", f"the cache entry of {uri}", wait=True):
            _sweep_orphaned_partials(root, digest)
            final, partial = root / digest, root / f"{digest}.partial"
            if (final / MANIFEST).exists():
                bad = _corrupt_files(final, objects)
                if not bad:
                    log.info("cache hit for %s at %s (sizes and checksums verified)", uri, final)
                    return IngestResult(uri, final, digest, Report(root=str(final)), 0, cache_hit=True)
                log.warning("cache entry %s: %d file(s) changed since download (e.g. %s); repairing", final,
                            len(bad), bad[0])
                (final / MANIFEST).unlink()
                if partial.exists():  # an interrupted repair left one: keep that, drop this entry
                    shutil.rmtree(final)
                else:
                    os.rename(final, partial)
            partial.mkdir(exist_ok=True)

            def fetch(obj: s3mod.S3Object) -> int:
                return download_object(client, src.bucket, obj, partial / obj.rel)

            with ThreadPoolExecutor(max(1, workers)) as pool:
                downloaded = sum(pool.map(fetch, objects))
            fsutil.atomic_write_json(partial / MANIFEST, {"source": uri, "objects": manifest}, indent=1)
            os.rename(partial, final)
    return IngestResult(uri, final, digest, Report(root=str(final)), downloaded)


MANIFEST = ".roboloop-manifest.json"


def _corrupt_files(root: Path, objects: list[s3mod.S3Object]) -> list[str]:
    """Files of a cache entry whose size or checksum no longer matches S3's (edited, truncated, deleted)."""
    bad = []
    for obj in objects:
        try:
            verify_file(root / obj.rel, obj)
        except (ChecksumError, OSError):
            bad.append(obj.rel)
    return bad


def _sweep_orphaned_partials(root: Path, keep: str) -> None:
    """Remove partial downloads of other manifests (the source changed under them) that nobody is writing."""
    for p in root.glob("*.partial"):
        digest = p.name.removesuffix(".partial")
        if digest == keep:
            continue
        try:
            with fsutil.exclusive(root / f".{digest}.roboloop-lock", "a partial download"):
                shutil.rmtree(p, ignore_errors=True)
        except BusyError:
            continue


def download_object(client: Any, bucket: str, obj: s3mod.S3Object, dest: Path) -> int:
    """Download (or resume) one object into `dest` and verify it; returns bytes transferred.

    A complete file that fails its checksum (edited after download, or a bad earlier transfer) is
    downloaded again once; a fresh download that still fails raises ChecksumError.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    transferred = 0
    for attempt in range(2):
        have = dest.stat().st_size if dest.exists() else 0
        if have > obj.size:
            dest.unlink()
            have = 0
        if have < obj.size:
            kwargs = {"Range": f"bytes={have}-"} if have else {}
            body = client.get_object(Bucket=bucket, Key=obj.key, **kwargs)["Body"]
            with open(dest, "ab" if have else "wb") as f:
                for chunk in iter(functools.partial(body.read, CHUNK), b""):
                    f.write(chunk)
                    transferred += len(chunk)
        try:
            verify_file(dest, obj)
            return transferred
        except ChecksumError:
            dest.unlink(missing_ok=True)
            if attempt == 1 or (have == 0 and transferred == obj.size):
                raise
    return transferred


def verify_file(path: Path, obj: s3mod.S3Object) -> None:
    size = path.stat().st_size
    if size != obj.size:
        raise ChecksumError(f"{obj.key}: downloaded {size} bytes, S3 says {obj.size}")
    etag = obj.etag
    if "-" not in etag:
        got = file_md5(path)
        if got != etag:
            raise ChecksumError(f"{obj.key}: MD5 {got} does not match ETag {etag} (corrupted object or transfer)")
        return
    parts = int(etag.split("-")[1])
    for part_size in _candidate_part_sizes(obj.size, parts):
        if _multipart_etag(path, part_size) == etag:
            return
    raise ChecksumError(f"{obj.key}: content does not match multipart ETag {etag} for any usual part size")


def _candidate_part_sizes(size: int, parts: int) -> list[int]:
    mb = 1024 * 1024
    guesses = [8 * mb, 16 * mb, 5 * mb, 64 * mb, 100 * mb]
    exact = -(-size // parts)
    guesses.append(-(-exact // mb) * mb)
    return [g for g in dict.fromkeys(guesses) if -(-size // g) == parts]


def _multipart_etag(path: Path, part_size: int) -> str:
    digests = []
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(part_size), b""):
            digests.append(hashlib.md5(chunk, usedforsecurity=False).digest())
    return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"
