"""Object stores behind the registry: a local folder and S3, with compare-and-swap writes.

`put_bytes(key, data, if_match=ETAG)` / `put_bytes(key, data, if_none_match=True)` either
write or raise `PreconditionFailed`; that is all the registry needs for atomic aliases and
version claims. S3 uses conditional PUTs (If-Match / If-None-Match, supported by AWS S3,
MinIO and moto); the local store holds an fcntl lock around check-and-rename.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from roboloop import fsutil
from roboloop.fsutil import STATE_ROOT, check_relative, private_dir


class PreconditionFailed(Exception):
    """Somebody else wrote the object first (or changed it since it was read)."""


class LocalStore:
    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()  # created by the first write: reading makes no folder
        self.uri = str(self.root)
        if self.root.parent.name == STATE_ROOT and self.root.parent.exists():
            private_dir(self.root.parent)  # the default registry: in roboloop's owner-only state folder

    def _path(self, key: str) -> Path:
        check_relative(key)
        return self.root / key

    @contextmanager
    def _lock(self) -> Iterator[None]:
        if self.root.parent.name == STATE_ROOT:
            private_dir(self.root.parent)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    @staticmethod
    def _etag(data: bytes) -> str:
        return hashlib.md5(data, usedforsecurity=False).hexdigest()

    def get_bytes(self, key: str) -> tuple[bytes, str] | None:
        p = self._path(key)
        if not p.exists():
            return None
        data = p.read_bytes()
        return data, self._etag(data)

    def put_bytes(self, key: str, data: bytes, if_match: str | None = None, if_none_match: bool = False) -> str:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        with self._lock():
            if if_none_match and p.exists():
                raise PreconditionFailed(key)
            if if_match is not None:
                cur = self.get_bytes(key)
                if cur is None or cur[1] != if_match:
                    raise PreconditionFailed(key)
            fsutil.atomic_write_bytes(p, data)  # umask permissions (mkstemp would make it 0600)
        return self._etag(data)

    def put_file(self, key: str, src: Path) -> None:
        p = self._path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = fsutil.temp_sibling(p)
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, p)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def get_file(self, key: str, dst: Path) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        src = self._path(key)
        if not src.is_file():
            raise FileNotFoundError(f"registry file {key} is missing from {self.root}")
        shutil.copyfile(src, dst)

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.exists():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith("."))

    def exists(self, key: str) -> bool:
        return self._path(key).exists()


class S3Store:
    def __init__(self, uri: str):
        from roboloop import s3

        self.loc = s3.S3Uri.parse(uri)
        self.c = s3.client()
        self.uri = str(self.loc)

    def _key(self, key: str) -> str:
        check_relative(key)
        return self.loc.key(key)

    def get_bytes(self, key: str) -> tuple[bytes, str] | None:
        try:
            r = self.c.get_object(Bucket=self.loc.bucket, Key=self._key(key))
        except self.c.exceptions.NoSuchKey:
            return None
        return r["Body"].read(), r["ETag"]

    def put_bytes(self, key: str, data: bytes, if_match: str | None = None, if_none_match: bool = False) -> str:
        from botocore.exceptions import ClientError

        kw: dict = {}
        if if_none_match:
            kw["IfNoneMatch"] = "*"
        if if_match is not None:
            kw["IfMatch"] = if_match
        try:
            r = self.c.put_object(Bucket=self.loc.bucket, Key=self._key(key), Body=data, **kw)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                # A retry of our own write whose reply was lost (botocore retries a PUT after a reset connection)
                # finds our object there and fails its condition: the write happened. What the registry writes
                # conditionally carries the writer's pid and time, so equal bytes are ours, never another's.
                now = self.get_bytes(key) if kw else None
                if now is not None and now[0] == data:
                    return now[1]
                raise PreconditionFailed(key) from e
            raise
        return r["ETag"]

    def put_file(self, key: str, src: Path) -> None:
        self.c.upload_file(str(src), self.loc.bucket, self._key(key))

    def get_file(self, key: str, dst: Path) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.part")
        self.c.download_file(self.loc.bucket, self._key(key), str(tmp))
        tmp.replace(dst)

    def list(self, prefix: str) -> list[str]:
        out: list[str] = []
        full = self._key(prefix) if prefix else self.loc.prefix
        strip = len(self.loc.prefix) + 1 if self.loc.prefix else 0
        for page in self.c.get_paginator("list_objects_v2").paginate(Bucket=self.loc.bucket, Prefix=full):
            out.extend(o["Key"][strip:] for o in page.get("Contents", []))
        return sorted(out)

    def exists(self, key: str) -> bool:
        return self.get_bytes(key) is not None if key.endswith(".json") else bool(self.list(key))


def open_store(uri: str | Path):
    from roboloop.s3 import is_s3

    return S3Store(str(uri)) if is_s3(uri) else LocalStore(uri)
