"""Following a registry: `resolve` a server's reference to a model folder, and `Follower`, the thread that watches
a registry alias (default `champion`) and swaps each new version in once it loaded and passed its check."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from roboloop.serving.service import PolicyService, redact

log = logging.getLogger("roboloop.serve")
CHECK_TIMEOUT_S = 300.0


class ModelCheck(BaseModel):
    """A new version to load and check in a child process (`python -m roboloop.entry check-model`)."""

    folder: str
    version: str
    device: str = "cpu"
    seed: int = 0
    precision: str = "fp32"


def check_in_child(folder: Path, version: str, service: PolicyService) -> None:
    """Load and check `folder` in a child process first, so that whatever loading it does (a crash, an abort, memory
    it takes) happens there and not in the serving process; raises with the child's one-line cause."""
    import tempfile

    from roboloop.warm import run_entry

    cfg = ModelCheck(folder=str(folder), version=version, device=service.device, seed=service.seed,
                     precision=service.precision)
    with tempfile.TemporaryDirectory(prefix="roboloop-check-") as work:
        run_entry("check-model", cfg, work, lambda line: log.info("[check %s] %s", version, line), CHECK_TIMEOUT_S,
                  f"the check of {version} in a child process")


def own_cache(root: Path, slots: int = 256) -> tuple[Path, Any]:
    """A download cache under `root` that no other server uses while this one runs: the first free `server-N`
    (held with an exclusive flock on `server-N.lock` for the holder's life; a server restarted finds its old
    downloads again). Each server's follower prunes the versions it no longer serves, so two servers started in
    one working directory pruned each other's models out from under them. Returns (folder, the open lock file:
    keep it)."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    for n in range(slots):
        lock = open(root / f"server-{n}.lock", "a+b")  # noqa: SIM115 - held open for the server's life
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return root / f"server-{n}", lock
    raise RuntimeError(f"{root}: {slots} servers hold a download cache here; stop one or give this one --cache")


def resolve(ref: str, cache: Path) -> tuple[Path, str, tuple[str | None, str, str] | None]:
    """A model folder or `registry:[URI#]NAME@REF` -> (folder, version label, (uri, name, alias) to follow when
    REF is an alias, else None)."""
    if ref.startswith("registry:"):
        from roboloop.registry import ALIASES, fetch, parse_ref

        folder, _, name, v, r = fetch(ref, cache)  # the server's own cache: its follower prunes it
        return folder, f"{name}@v{v}", ((parse_ref(ref)[0], name, r) if r in ALIASES else None)
    folder = Path(ref)
    if not folder.is_dir():
        raise FileNotFoundError(f"{ref}: not a model folder nor registry:NAME@REF")
    return folder, folder.resolve().name, None


class Follower(threading.Thread):
    """Polls a registry alias (default `champion`); a new version is loaded and checked in a child process, then
    loaded, checked on the last request's observation and swapped in here. A refused
    version is tried again after `retry_s` (a download that failed, a check that met a bad moment); the cached
    folders of versions no session uses any more are removed (only what roboloop downloaded there)."""

    def __init__(self, service: PolicyService, uri: str | None, name: str, alias: str, cache: Path,
                 interval: float = 2.0, retry_s: float = 60.0, isolate: bool = True):
        super().__init__(daemon=True, name="roboloop-serve-follow")
        self.service, self.uri, self.name, self.alias, self.cache = service, uri, name, alias, cache
        self.interval, self.retry_s, self.stop_event = interval, retry_s, threading.Event()
        self.isolate = isolate  # load and check each new version in a child process before this one loads it
        self.seen: int | None = None
        self.failed: tuple[int, float] | None = None  # the refused version and when
        self.kept: set[Path] = set()  # the cached folders the last prune kept

    def poll(self) -> bool:
        from roboloop.registry import Registry, _vname

        self.prune()
        reg = Registry(self.uri)
        v = reg.aliases(self.name)[0].get(self.alias)
        if v is None:
            if not self.service.follow_note:
                self.service.follow_note = (f"{self.name}@{self.alias} is no longer in the registry (deleted?): "
                                            f"still serving {self.service.slot.version}")
                log.error("%s (registry %s)", self.service.follow_note, reg.uri)
            return False
        self.service.follow_note = ""
        v = int(v)
        retry = self.failed is not None and self.failed[0] == v and time.monotonic() - self.failed[1] >= self.retry_s
        if v == self.seen and not retry:
            return False
        self.seen = v
        label = f"{self.name}@v{v}"
        if self.service.slot.version.startswith(label + "+"):
            return False
        log.warning("%s@%s moved to v%s: loading it beside %s", self.name, self.alias, v, self.service.slot.version)
        folder = self.cache / self.name / _vname(v)
        try:
            reg.download(self.name, v, folder, overwrite=True)
            if self.isolate:
                check_in_child(folder, label, self.service)
            ok = self.service.swap_to(folder, label)
        except Exception as e:  # a version that cannot be downloaded is refused like one that does not load
            self.service.refused = redact(f"{label} refused: {type(e).__name__}: {e}")[:500]
            log.error("keeping %s: %s: %s", self.service.slot.version, label, e)
            ok = False
        self.failed = None if ok else (v, time.monotonic())
        self.kept = set()  # a new folder, or a refused one: look again
        self.prune()
        return ok

    def prune(self) -> None:
        """Remove cached versions (and the copies a re-download moved aside) that no lane serves."""
        import shutil

        from roboloop import fsutil

        with self.service.state_lock:
            slots = [*self.service.lanes.values(), self.service.slot]
        keep = {slot.folder.resolve() for slot in slots}
        if keep == self.kept:
            return
        self.kept = keep
        root = self.cache / self.name
        for d in sorted(root.iterdir()) if root.is_dir() else []:
            if d.is_dir() and not d.is_symlink() and d.resolve() not in keep and fsutil.is_ours(d, "model"):
                shutil.rmtree(d, ignore_errors=True)  # roboloop's own download (its marker says so)

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            try:
                self.poll()
            except Exception as e:  # a registry hiccup must not stop following
                log.error("following %s@%s: %s", self.name, self.alias, e)
