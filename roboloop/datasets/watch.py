"""Which LeRobot datasets in a watched location are new or changed since the last look.

A location is a local folder or an `s3://bucket/prefix`; each dataset is a direct child holding
`meta/info.json`. A dataset's fingerprint is the size and modification time (local) or size and
ETag (S3) of every file under `meta/` plus its data files' count and total size: a dataset still being
copied changes its fingerprint again, and is reported once more when it has. The state of the last
look is a small JSON file (written atomically) that roboloop owns; nothing in the location is touched.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from roboloop import fsutil, s3


def _fingerprint(items: list[tuple[str, int, str]]) -> str:
    return hashlib.sha256(json.dumps(sorted(items)).encode()).hexdigest()[:16]


def scan(location: str) -> dict[str, str]:
    """{dataset path or URI: fingerprint} for every dataset directly under `location`."""
    if s3.is_s3(location):
        uri = s3.S3Uri.parse(location)
        by: dict[str, list[tuple[str, int, str]]] = {}
        for o in s3.list_objects(s3.client(), uri):
            name, _, rest = o.rel.partition("/")
            if rest:
                by.setdefault(name, []).append((rest, o.size, o.etag if rest.startswith("meta/") else ""))
        return {f"s3://{uri.bucket}/{uri.key(n)}": _fingerprint(f) for n, f in sorted(by.items())
                if any(r == "meta/info.json" for r, _, _ in f)}
    root = Path(location)
    out = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if d.name.startswith(".") or not (d / "meta" / "info.json").is_file():  # hidden: a copy in progress
            continue
        files = []
        for f in d.rglob("*"):
            if f.is_file() and not f.name.startswith("."):
                rel, st = f.relative_to(d).as_posix(), f.stat()
                files.append((rel, st.st_size, str(st.st_mtime_ns) if rel.startswith("meta/") else ""))
        out[str(d.absolute())] = _fingerprint(files)
    return out


def changes(location: str, state_file: str | Path) -> list[str]:
    """Datasets in `location` that are new or changed since the state file's look; the state is updated."""
    state = Path(state_file)
    seen = json.loads(state.read_text()) if state.is_file() else {}
    now = scan(location)
    new = [p for p, fp in now.items() if seen.get(p) != fp]
    state.parent.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_text(state, json.dumps(now, indent=1, sort_keys=True))
    return new
