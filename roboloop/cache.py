"""Stage caches that cannot lie.

A receipt is stored under a key made of its inputs' content identities (dataset md5s, weight
sha256s), the stage's config and the library's code version: never a path or an alias string
(`@champion` is resolved to a version, and that version to its weights, before keying). A hit
is trusted only after its output is checked against the receipt (folder md5, weights sha256,
report sha256). An output that is gone or changed is restored from the DVC cache or remote by
its md5 when it was tracked; otherwise the caller recomputes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, TypeVar

from roboloop import fsutil
from roboloop.hashing import MODEL_IGNORE, dir_md5, file_sha256
from roboloop.receipts import Checkpoints, DatasetRef, EvalSummary, ModelRef, OfflineSummary, Receipt

log = logging.getLogger(__name__)
R = TypeVar("R", bound=Receipt)


def _canonical(x: Any) -> Any:
    """1.0 and 1 are the same setting (a config read back from JSON turns int defaults into floats)."""
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, dict):
        return {k: _canonical(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_canonical(v) for v in x]
    return x


def cache_key(stage: str, *parts: Any) -> str:
    """stage + inputs' identities + config + code version (a hash of roboloop's source)."""
    from roboloop.lineage import code_version

    blob = json.dumps(_canonical([stage, code_version(), *parts]), sort_keys=True, default=str)
    return f"{stage}-{hashlib.sha256(blob.encode()).hexdigest()[:24]}"


def convert_key(source_md5: str, cfg: Any) -> str:
    """A v2 -> v3 conversion's key: its receipt's, and the one in the marker it leaves in its output."""
    from roboloop.keys import keyed

    return cache_key("convert", source_md5, keyed(cfg))


def verify(receipt: Receipt) -> bool:
    """Does the output the receipt names exist, with the content it recorded?"""
    try:
        if isinstance(receipt, DatasetRef):
            return (Path(receipt.path) / "meta" / "info.json").is_file() and dir_md5(receipt.path) == receipt.md5
        if isinstance(receipt, ModelRef):
            return file_sha256(Path(receipt.path) / "model.safetensors") == receipt.weights_sha256
        if isinstance(receipt, EvalSummary):
            return file_sha256(Path(receipt.run_dir) / "report.json") == receipt.report_sha256
        if isinstance(receipt, OfflineSummary):
            return file_sha256(Path(receipt.run_dir) / "offline.json") == receipt.report_sha256
        if isinstance(receipt, Checkpoints):
            return all(verify(m) for m in receipt.models)
    except OSError:
        return False
    return True


def restore(receipt: Receipt) -> bool:
    """Bring a dataset or model folder back from the DVC cache/remote by its md5 (when it was tracked)."""
    if isinstance(receipt, Checkpoints):
        return all(verify(m) or restore(m) for m in receipt.models)
    if not isinstance(receipt, DatasetRef | ModelRef):
        return False
    from roboloop import dvc

    ok = dvc.restore(Path(receipt.path), receipt.md5, MODEL_IGNORE if isinstance(receipt, ModelRef) else ())
    return ok and verify(receipt)


class ReceiptCache:
    def __init__(self, root: str | Path | None = None):
        if root is None:
            from roboloop.settings import settings

            root = Path(settings().cache_dir) / "receipts"
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, key: str, cls: type[R]) -> R | None:
        """The receipt stored under `key`, if its output checks out (restored from DVC if need be)."""
        path = self._path(key)
        if not path.exists():
            return None
        try:
            receipt = cls.model_validate_json(path.read_text())
        except ValueError:
            log.warning("receipt %s is unreadable; recomputing", path)
            return None
        if verify(receipt):
            return receipt
        if restore(receipt):
            log.info("restored %s from DVC", getattr(receipt, "path", key))
            return receipt
        log.warning("cached output of %s is gone or changed; recomputing", key)
        return None

    def has(self, key: str) -> bool:
        """Is a receipt stored under `key` (checked or not)?"""
        return self._path(key).exists()

    def put(self, key: str, receipt: Receipt) -> None:
        fsutil.atomic_write_text(self._path(key), receipt.model_dump_json(indent=1))
