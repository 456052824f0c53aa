"""What every roboloop task shares: content cache keys, transient-failure retries, log bridging."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from prefect import get_run_logger
from prefect.cache_policies import NO_CACHE  # noqa: F401  (re-exported for tasks that must not cache)

from roboloop.lineage import code_version


def content_key(stage: str, *parts: Any) -> str:
    """Cache key = stage + input content (DVC md5s) + config + library code version."""
    blob = json.dumps([stage, code_version(), *parts], sort_keys=True, default=str)
    return f"{stage}-{hashlib.sha256(blob.encode()).hexdigest()[:24]}"


TRANSIENT = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionError",
             "ConnectionResetError", "ChecksumError", "IncompleteReadError", "SlowDown", "ServiceUnavailable")


def retry_if_transient(task, task_run, state) -> bool:
    """Retry network/S3 hiccups only; a bad dataset or a bug fails at once."""
    try:
        state.result()
    except Exception as e:  # the failure being judged
        chain, cur = [], e
        while cur is not None:
            chain.append(type(cur).__name__ + " " + str(cur)[:200])
            cur = cur.__cause__ or cur.__context__  # type: ignore[assignment]
        return any(name in " ".join(chain) for name in TRANSIENT)
    return False


_NOISE = re.compile(r"^\s*$")


def relay(prefix: str = ""):
    """A line sink that forwards a child process's output to the Prefect run log."""
    logger = get_run_logger()

    def on_line(line: str) -> None:
        if not _NOISE.match(line):
            logger.info("%s%s", prefix, line)

    return on_line
