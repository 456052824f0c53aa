"""What every roboloop task shares: receipt caches, artifact keys, transient-failure retries, log bridging.

Caching is the library's (`roboloop.cache`), not Prefect's result cache: a cached receipt is used
only after its output is checked against it (or restored from DVC), which Prefect's cache cannot
do. A task's body therefore always runs, and re-publishes its artifacts from the receipt, so a
rerun shows the same results in the UI as the run that computed them.
"""

from __future__ import annotations

import base64
import logging
import re
from pathlib import Path

from prefect import get_run_logger
from prefect.cache_policies import NO_CACHE  # noqa: F401  (re-exported: tasks cache through roboloop.cache)

from roboloop.cache import ReceiptCache
from roboloop.procs import log_level
from roboloop.stages import slug

TRANSIENT = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionError",
             "ConnectionResetError", "ChecksumError", "IncompleteReadError", "SlowDown", "ServiceUnavailable",
             "S3EndpointError")


def receipts() -> ReceiptCache:
    return ReceiptCache()


def artifact_key(*parts: object) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only (`@`, `:`, `.` are rejected)."""
    return slug("-".join(str(p) for p in parts if p is not None and str(p)), 96)


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


def _data_uri(path: Path, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


def png_markdown(path: str | Path | None, alt: str, max_bytes: int = 400_000) -> str:
    """An image inlined as a data: URI, which the Prefect UI renders (a file:// link would be a broken image)."""
    if not path or not Path(path).is_file() or Path(path).stat().st_size > max_bytes:
        return ""
    return f"![{alt}]({_data_uri(Path(path), 'image/png')})"


def video_markdown(path: str | Path | None, alt: str, max_bytes: int = 2_000_000) -> str:
    """An mp4 inlined as a data: URI in a <video> element, which the Prefect UI renders playable (checked in
    Chromium by tests/ui); a bigger file is named instead (its path is on the worker's disk)."""
    if not path or not Path(path).is_file():
        return ""
    size = Path(path).stat().st_size
    if size > max_bytes:
        return f"`{Path(path).name}` ({size / 1e6:.1f} MB, on the worker: {path})"
    return (f'<video src="{_data_uri(Path(path), "video/mp4")}" title="{alt}" controls muted loop playsinline '
            'width="256"></video>')


_BLANK = re.compile(r"^\s*$")
_PROGRESS = "[progress] "


def relay(prefix: str = ""):
    """A line sink that forwards a child process's output to the Prefect run log: progress and roboloop's
    own lines at INFO, simulator chatter and JSON lines at DEBUG, errors at WARNING, repeats once."""
    logger = get_run_logger()
    seen: set[str] = set()

    def on_line(line: str) -> None:
        if _BLANK.match(line):
            return
        if line.startswith(_PROGRESS):
            logger.info("%s%s", prefix, line[len(_PROGRESS):])
            return
        level = log_level(line)
        if level == logging.DEBUG and line in seen:
            return
        seen.add(line)
        logger.log(level, "%s%s", prefix, line)

    return on_line
