"""S3 access through boto3, for any S3-compatible store.

The endpoint and credentials come from the environment (ROBOLOOP_S3_ENDPOINT_URL or
AWS_ENDPOINT_URL, and boto3's usual AWS_* variables), never from flow parameters, so they
never reach a log line or the Prefect UI.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roboloop.fsutil import check_relative
from roboloop.settings import S3Settings

__all__ = ["S3Settings", "S3Uri", "client", "list_objects", "translate_error", "upload_dir"]


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    prefix: str  # no leading or trailing slash

    @classmethod
    def parse(cls, uri: str) -> S3Uri:
        if not uri.startswith("s3://"):
            raise ValueError(f"not an s3:// URI: {uri!r}")
        bucket, _, prefix = uri[5:].partition("/")
        if not bucket:
            raise ValueError(f"no bucket in {uri!r}")
        return cls(bucket, prefix.strip("/"))

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def is_s3(uri: str | Path) -> bool:
    return str(uri).startswith("s3://")


def client(settings: S3Settings | None = None) -> Any:
    import boto3
    from botocore.config import Config

    s = settings or S3Settings()
    return boto3.client(
        "s3",
        endpoint_url=s.endpoint_url,
        region_name=s.region,
        config=Config(max_pool_connections=s.max_pool_connections,
                      retries={"max_attempts": s.max_attempts, "mode": "standard"},
                      connect_timeout=s.connect_timeout_s, read_timeout=s.read_timeout_s),
    )


@dataclass(frozen=True)
class S3Object:
    rel: str  # key relative to the prefix, checked not to escape it
    key: str
    size: int
    etag: str


def list_objects(s3: Any, uri: S3Uri) -> list[S3Object]:
    """Every object under the prefix; keys that would escape the dataset root are refused."""
    out = []
    paginator = s3.get_paginator("list_objects_v2")
    base = uri.prefix + "/" if uri.prefix else ""
    for page in paginator.paginate(Bucket=uri.bucket, Prefix=base):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(base):]
            if not rel or rel.endswith("/"):
                continue
            check_relative(rel)  # raises UnsafePathError for '..' or absolute keys
            out.append(S3Object(rel, obj["Key"], int(obj["Size"]), obj["ETag"].strip('"')))
    return sorted(out, key=lambda o: o.rel)


def upload_dir(local: str | Path, uri: str, settings: S3Settings | None = None, workers: int = 8) -> int:
    """Upload every file under `local` to `uri`; returns the number of files."""
    s3 = client(settings)
    dest = S3Uri.parse(uri)
    root = Path(local)
    files = [p for p in sorted(root.rglob("*")) if p.is_file()]

    def put(p: Path) -> None:
        s3.upload_file(str(p), dest.bucket, dest.key(p.relative_to(root).as_posix()))

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(put, files))
    return len(files)


def abort_uploads(s3: Any, bucket: str, prefix: str, abandoned: Callable[[str], bool]) -> list[str]:
    """Abort the unfinished multipart uploads under `prefix` whose key the caller knows nobody writes any more
    (`abandoned(key)`): a writer killed or cut mid-upload leaves its parts stored, and billed, until someone aborts
    them. Returns the keys aborted."""
    aborted = []
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
        for up in page.get("Uploads", []):
            if abandoned(up["Key"]):
                s3.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
                aborted.append(up["Key"])
    return aborted


CREDENTIAL_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken",
                    "AuthorizationHeaderMalformed", "403"}


def translate_error(e: BaseException, what: str = "") -> Exception:
    """A boto3/botocore failure as one roboloop error per cause (credentials, bucket, endpoint, key)."""
    from botocore import exceptions as bx

    from roboloop import errors

    on = f" ({what})" if what else ""
    if isinstance(e, bx.NoCredentialsError | bx.PartialCredentialsError):
        return errors.S3CredentialsError(f"no S3 credentials{on}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                                         "(or AWS_PROFILE)")
    if isinstance(e, bx.EndpointConnectionError | bx.ConnectTimeoutError | bx.ConnectionClosedError):
        endpoint = getattr(e, "kwargs", {}).get("endpoint_url") or S3Settings().endpoint_url or "the S3 endpoint"
        return errors.S3EndpointError(f"cannot reach {endpoint}{on}: check ROBOLOOP_S3_ENDPOINT_URL / "
                                      "AWS_ENDPOINT_URL and the network")
    if isinstance(e, bx.ClientError):
        err = e.response.get("Error", {})
        code, msg = str(err.get("Code", "")), err.get("Message", "")
        bucket = err.get("BucketName", "")
        if code in CREDENTIAL_CODES:
            return errors.S3CredentialsError(f"S3 refused the credentials{on}: {code} {msg}".strip())
        if code == "NoSuchBucket":
            return errors.S3BucketError(f"bucket {bucket or '?'} does not exist{on}")
        if code in ("NoSuchKey", "404", "NotFound"):
            return errors.S3KeyError(f"object not found{on}: it was deleted or never existed ({code})")
        return errors.S3Error(f"S3 error {code}{on}: {msg}")
    if isinstance(e, bx.BotoCoreError):
        return errors.S3Error(f"S3 client error{on}: {e}")
    return e if isinstance(e, Exception) else RuntimeError(str(e))


class translated:
    """`with s3.translated("listing s3://b/p"):` re-raises boto errors as roboloop's, the original chained."""

    def __init__(self, what: str = ""):
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ, exc, tb) -> None:
        if exc is not None and type(exc).__module__.startswith(("botocore", "boto3", "s3transfer")):
            raise translate_error(exc, self.what) from exc
