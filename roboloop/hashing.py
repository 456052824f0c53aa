"""Content hashes that identify stage outputs: DVC-compatible folder md5s and weight sha256s.

`dir_md5` computes exactly the md5 `dvc add` records for a folder (the md5 of the sorted JSON
list of {"md5", "relpath"} entries, suffixed `.dir`), without a DVC repository: receipts carry
the same identity whether or not the output is DVC-tracked, and a DVC cache can restore it.
Model folders leave out what `.dvcignore` leaves out (resumable state, liveness files).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

CHUNK = 8 * 1024 * 1024
MODEL_IGNORE = ("checkpoints", "heartbeat.json", "heartbeat.tmp")


# Inside `remembering()`, md5s of the files hashed, by (device, inode, size, mtime): DVC's own rule for
# "unchanged" (its state database). A rename keeps all four, so a folder hashed just before it is published is
# not read again right after. Outside that block every call reads the file: a verification must see bit rot.
_MEMO: dict[tuple[int, int, int, int], str] | None = None


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    """For one stage's span: what it hashes while it writes (a conversion hashes its output beside the output
    check) is not read again for its receipt."""
    global _MEMO
    outer, _MEMO = _MEMO, ({} if _MEMO is None else _MEMO)
    try:
        yield
    finally:
        _MEMO = outer


def remembering_now() -> bool:
    """Is a `remembering()` block open (so that hashing something ahead of time spares a later read)?"""
    return _MEMO is not None


def file_md5(path: Path) -> str:
    memo = _MEMO
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if memo is not None and (known := memo.get(key)) is not None:
        return known
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    if memo is not None and os.stat(path).st_mtime_ns == st.st_mtime_ns:  # not written to while it was read
        memo[key] = h.hexdigest()
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def dir_entries(root: Path, ignore: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """Each file's md5, hashed on a thread per core (hashlib releases the GIL on large buffers)."""
    from concurrent.futures import ThreadPoolExecutor

    files = [(p, p.relative_to(root)) for p in sorted(root.rglob("*"))]
    files = [(p, rel) for p, rel in files if p.is_file() and not any(part in ignore for part in rel.parts)]
    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
        md5s = list(pool.map(file_md5, [p for p, _ in files]))
    out = [{"md5": m, "relpath": rel.as_posix()} for m, (_, rel) in zip(md5s, files, strict=True)]
    out.sort(key=lambda e: e["relpath"])
    return out


def dir_md5(root: str | Path, ignore: tuple[str, ...] = ()) -> str:
    """The md5 DVC records for this folder (`dvc add`), e.g. `81a93d8d....dir`."""
    entries = dir_entries(Path(root), ignore)
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode(), usedforsecurity=False).hexdigest() + ".dir"


# A model folder's files that record how it was trained or that it is alive, not how its weights act
NOT_ACTING = (*MODEL_IGNORE, "model.safetensors", "metrics.jsonl", "loss.png")


def acting_digest(folder: str | Path) -> str:
    """sha256 over a model folder's top-level files that decide how its weights act besides the weights themselves
    (config.json's inference settings, stats.json's normalisation, LeRobot's processors): an evaluation keyed on the
    weights alone would return a result cached before someone edited `inference_steps` in config.json."""
    h = hashlib.sha256()
    for p in sorted(Path(folder).iterdir()):
        if p.is_file() and p.name not in NOT_ACTING:
            h.update(f"{p.name}\0{file_sha256(p)}\0".encode())
    return h.hexdigest()
