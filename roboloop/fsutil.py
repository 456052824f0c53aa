"""The one home of roboloop's destructive and atomic file operations.

Rules every stage follows through these helpers:
- Never write what you would refuse to read: outputs are built in a temporary sibling folder
  (`.NAME.roboloop-tmp-PID-XXXX`) and renamed into place only when complete.
- Never delete or overwrite what roboloop did not create: a destination that exists is refused,
  naming it and the flag to choose another, unless it is roboloop's own output of that kind
  (it carries a marker file) and the caller passed `overwrite`, in which case the old folder is
  moved aside (`NAME.replaced-TIMESTAMP`), never deleted.
- Temporary folders die with their owner: removed on failure, swept by the next run when the
  process that made them is gone.
- Outputs get the umask's permissions (`tempfile.mkdtemp` would make them 0700).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from roboloop.errors import BusyError, DestinationExistsError

MARKER = ".roboloop-output.json"
TMP_TAG = ".roboloop-tmp-"


# ---------------------------------------------------------------- files
def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` via a temporary sibling and a rename (readers never see half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}{TMP_TAG}{os.getpid()}-{secrets.token_hex(3)}")
    try:
        with open(tmp, "xb") as f:  # mode from the umask, unlike mkstemp's 0600
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    return atomic_write_bytes(path, (json.dumps(obj, indent=indent) + "\n").encode())


# ---------------------------------------------------------------- private state
STATE_ROOT = ".roboloop"  # roboloop's own state folder: the token, the local registry, caches, DVC's site cache


def private_dir(path: str | Path) -> Path:
    """A folder that holds secrets or a registry: created owner-only (0700). One that exists is refused when it is a
    link or another user's; when others may write it, it is made owner-only if it is roboloop's state folder
    (DVC, which creates its site cache under it with mode 0777, left `.roboloop/` world-writable in a fresh clone),
    and refused otherwise (it is the user's folder: they choose its mode)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
    st = os.lstat(path)
    if os.path.islink(path) or not os.path.isdir(path):
        raise PermissionError(f"{path}: a link or not a folder where roboloop keeps private state; refused")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{path} belongs to user {st.st_uid}, not to this one ({os.geteuid()}): roboloop does "
                              "not keep its private state in another user's folder")
    if st.st_mode & 0o022:
        if path.name != STATE_ROOT:
            raise PermissionError(f"{path}: mode {st.st_mode & 0o777:o} lets other users replace what it holds; "
                                  f"chmod go-w {path}")
        os.chmod(path, 0o700)
    return path


def check_private_file(path: str | Path, what: str) -> Path:
    """A file roboloop reads a secret from: a regular file (not a link) of this user, readable by no one else, in
    a folder no one else can write."""
    path = Path(path)
    st = os.lstat(path)
    if os.path.islink(path) or not os.path.isfile(path):
        raise PermissionError(f"{path}: {what} must be a regular file, not a link")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{path}: {what} belongs to user {st.st_uid}, not to this one ({os.geteuid()})")
    if st.st_mode & 0o077:
        raise PermissionError(f"{path}: mode {st.st_mode & 0o777:o} lets other users read {what}; chmod 600 {path}")
    parent = os.stat(path.parent)
    if parent.st_mode & 0o022 and not parent.st_mode & 0o1000:  # (a sticky folder, /tmp, keeps files their owner's)
        raise PermissionError(f"{path.parent}: mode {parent.st_mode & 0o777:o} lets other users replace {what}; "
                              f"chmod go-w {path.parent}")
    return path


# ---------------------------------------------------------------- ownership
def read_marker(path: str | Path) -> dict | None:
    """The marker roboloop leaves in every folder it creates, or None (not ours, or unreadable)."""
    try:
        doc = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("created_by") == "roboloop" else None


def is_ours(path: str | Path, kind: str | None = None) -> bool:
    m = read_marker(path)
    return m is not None and (kind is None or m.get("kind") == kind)


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


def check_destination(dst: str | Path, kind: str, overwrite: bool = False, flag: str = "DST") -> None:
    """Refuse a destination that exists, unless it is empty or roboloop's own `kind` and `overwrite` is set."""
    dst = Path(dst)
    if not (dst.exists() or dst.is_symlink()) or _is_empty_dir(dst):
        return
    if dst.is_symlink() or not dst.is_dir():
        raise DestinationExistsError(f"{dst} already exists and is not a folder roboloop created; choose another "
                                     f"destination ({flag})")
    marker = read_marker(dst)
    if marker is None:
        raise DestinationExistsError(f"{dst} already exists and was not created by roboloop; it is left untouched: "
                                     f"choose another destination ({flag})")
    if marker.get("kind") != kind:
        raise DestinationExistsError(f"{dst} holds a roboloop {marker.get('kind')}, not a {kind}; choose another "
                                     f"destination ({flag})")
    if not overwrite:
        raise DestinationExistsError(f"{dst} already holds a roboloop {kind}; choose another destination ({flag}) "
                                     "or pass --overwrite to move the old one aside")


class UnsafePathError(ValueError):
    """A path named by metadata (a dataset's templates, an S3 key, a registry file) would escape its root."""


def check_relative(rel: str) -> PurePosixPath:
    """Return `rel` as a relative POSIX path, refusing absolute paths and `..` parts."""
    if not rel or "\x00" in rel:
        raise UnsafePathError(f"empty or NUL-containing path {rel!r}")
    p = PurePosixPath(rel.replace("\\", "/"))
    if p.is_absolute() or rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        raise UnsafePathError(f"absolute path {rel!r} is not allowed inside a dataset")
    if any(part == ".." for part in p.parts):
        raise UnsafePathError(f"path {rel!r} escapes the dataset root ('..')")
    return p


def umask() -> int:
    """This process's umask, read without changing it (Linux: /proc; elsewhere set and restore)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def save_safetensors(weights: Any, path: str | Path) -> Path:
    """safetensors' `save_file` with the umask's permissions (it creates the file 0600, unlike every other
    output; a model folder readable only by its writer cannot be served or shared)."""
    from safetensors.torch import save_file

    # safetensors stores row-major bytes and refuses other layouts (channels-last conv weights)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path))
    os.chmod(path, 0o666 & ~umask())
    return Path(path)


def make_dir(path: Path) -> Path:
    """mkdir with the umask's permissions (what users expect of outputs)."""
    os.mkdir(path, 0o777)
    return path


def sweep_temps(dst: Path) -> list[Path]:
    """Remove temporary siblings of `dst` left by roboloop processes that are gone."""
    removed = []
    for p in dst.parent.glob(f".{dst.name}{TMP_TAG}*"):
        try:
            pid = int(p.name.split(TMP_TAG, 1)[1].split("-")[0])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not pid_alive(pid):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temp_sibling(dst: Path) -> Path:
    return dst.parent / f".{dst.name}{TMP_TAG}{os.getpid()}-{secrets.token_hex(3)}"


@contextlib.contextmanager
def atomic_dir(dst: str | Path, kind: str, overwrite: bool = False, meta: dict | Callable[[], dict] | None = None,
               flag: str = "DST") -> Iterator[Path]:
    """Build a folder in a temporary sibling, then publish it at `dst` with roboloop's marker.

    The marker's content is `meta` plus kind: keep it deterministic, it is part of the output
    (and of its DVC md5); a callable is asked for it once the folder is built (a key still being computed
    while it was). On any failure the temporary folder is removed and `dst` is untouched.
    """
    dst = Path(dst).absolute()
    check_destination(dst, kind, overwrite, flag)
    dst.parent.mkdir(parents=True, exist_ok=True)
    sweep_temps(dst)
    tmp = make_dir(temp_sibling(dst))
    try:
        yield tmp
        meta = meta() if callable(meta) else meta
        (tmp / MARKER).write_text(json.dumps({"created_by": "roboloop", "kind": kind, **(meta or {})},
                                             sort_keys=True, indent=1) + "\n")
        publish(tmp, dst, kind, overwrite, flag)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish(tmp: Path, dst: Path, kind: str, overwrite: bool, flag: str = "DST") -> Path | None:
    """Rename `tmp` to `dst`; an existing roboloop `kind` there is moved aside first (returned)."""
    check_destination(dst, kind, overwrite, flag)  # again: the world may have changed while we worked
    aside = None
    if _is_empty_dir(dst):
        dst.rmdir()
    elif dst.exists():
        aside = dst.with_name(f"{dst.name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}")
        os.rename(dst, aside)
    os.rename(tmp, dst)
    return aside


def inside(path: Path, root: Path) -> bool:
    """Is `path` (resolved) `root` or below it?"""
    p, r = path.resolve(), root.resolve()
    return p == r or r in p.parents


# ---------------------------------------------------------------- locks
@contextlib.contextmanager
def exclusive(lock_path: str | Path, what: str, wait: bool = False) -> Iterator[None]:
    """An fcntl lock (released when the process dies, however it dies). `wait=False` fails at once, naming
    the holder; `wait=True` serialises."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError as e:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise BusyError(f"{what} is being written by {holder} right now; wait for it to finish") from e
        f.seek(0)
        f.truncate()
        f.write(f"roboloop pid {os.getpid()}")
        f.flush()
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lock_path.unlink()
            fcntl.flock(f, fcntl.LOCK_UN)


def lock_path_for(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.roboloop-lock"
