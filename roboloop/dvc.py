"""DVC tracking of stage outputs, for versioning and lineage.

`track(path)` writes `<path>.dvc`, stores the content in the DVC cache, pushes it to the
default remote and returns the md5 that lineage records. The repository's default remote
is a local folder (`.roboloop/dvc-remote`); on a cluster point it at S3 with
`dvc remote add -d s3 s3://bucket/path` — nothing here changes.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from roboloop import fsutil

log = logging.getLogger(__name__)

LOCAL_REMOTE = ".roboloop/dvc-remote"


@dataclass(frozen=True)
class Tracked:
    path: Path
    dvc_file: Path
    md5: str
    size: int | None
    nfiles: int | None


def find_root(start: str | Path = ".") -> Path | None:
    p = Path(start).resolve()
    for cand in (p, *p.parents):
        if (cand / ".dvc").is_dir():
            return cand
    return None


def init_repo(root: str | Path, remote: str = LOCAL_REMOTE) -> Path:
    """Make `root` a DVC repo (inside git when there is one) with a default local remote."""
    from dvc.repo import Repo

    root = Path(root).resolve()
    fsutil.private_dir(root / fsutil.STATE_ROOT)  # before DVC makes its site cache there with mode 0777
    if not (root / ".dvc").is_dir():
        with _quiet():
            Repo.init(str(root), no_scm=not (root / ".git").exists())
    with Repo(str(root)) as repo:
        with repo.config.edit() as conf:  # committed: the default remote, relative to the repository
            if "remote" not in conf["core"]:
                conf["core"]["remote"] = "local"
            conf["remote"].setdefault("local", {"url": str(root / remote)})
            if "autostage" not in conf["core"]:
                conf["core"]["autostage"] = False
        with repo.config.edit("local") as conf:  # machine-specific, untracked (.dvc/config.local)
            conf["core"].setdefault("site_cache_dir", str(root / ".roboloop" / "dvc-site"))
    ignore = root / ".dvcignore"
    if "checkpoints/" not in (ignore.read_text() if ignore.exists() else ""):
        with open(ignore, "a") as f:  # a model version is its final files, not its resumable state
            f.write("checkpoints/\nheartbeat.json\nheartbeat.tmp\n")
    return root


def track(path: str | Path, push: bool = True, repo_root: str | Path | None = None) -> Tracked:
    """`dvc add` (and push) `path`; return its md5 (a `.dir` md5 for folders)."""
    from dvc.repo import Repo

    path = Path(path).resolve()
    root = Path(repo_root).resolve() if repo_root else find_root(path)
    if root is None:
        raise ValueError(f"{path} is not inside a DVC repository (run `dvc init` or roboloop.dvc.init_repo)")
    if (root / fsutil.STATE_ROOT).exists():
        fsutil.private_dir(root / fsutil.STATE_ROOT)
    dvc_file = path.with_name(path.name + ".dvc")
    committed = dvc_file.read_bytes() if _in_git(root, dvc_file) else None
    with Repo(str(root)) as repo, _quiet():
        stages = repo.add([str(path)])
        out = stages[0].outs[0]
        if push:
            repo.push([stages[0].path])
    if committed is not None and dvc_file.read_bytes() != committed:
        # a .dvc file the repository commits (the demo's data.dvc) is the user's: its content stays as committed,
        # so the checkout stays clean and lineage names the commit without '-dirty'; the data's own md5 is what
        # lineage records, and the difference is said here
        fsutil.atomic_write_bytes(dvc_file, committed)
        log.warning("%s: the data's md5 is %s; %s (committed) records %s: left as committed",
                    path.name, out.hash_info.value, dvc_file.name, _md5_in(committed))
    meta = out.meta
    return Tracked(path, Path(stages[0].path), out.hash_info.value, meta.size, meta.nfiles)


def _in_git(root: Path, file: Path) -> bool:
    """Is `file` committed in the git repository at `root`?"""
    import subprocess

    if not file.exists() or not (root / ".git").exists():
        return False
    return subprocess.run(["git", "ls-files", "--error-unmatch", str(file)], cwd=root, capture_output=True
                          ).returncode == 0


def _md5_in(dvc_text: bytes) -> str:
    import yaml  # type: ignore[import-untyped]

    try:
        return str(yaml.safe_load(dvc_text)["outs"][0]["md5"])
    except (ValueError, KeyError, IndexError, TypeError, yaml.YAMLError):
        return "an unreadable md5"


def md5_of(dvc_file: str | Path) -> str:
    """The md5 recorded in a `.dvc` file (what lineage cites without touching the data)."""
    import yaml  # type: ignore[import-untyped]

    doc = yaml.safe_load(Path(dvc_file).read_text())
    return doc["outs"][0]["md5"]


@contextlib.contextmanager
def _quiet():
    """DVC prints git hints (stdout and its INFO log); keep library calls silent."""
    dvc_log = logging.getLogger("dvc")
    level = dvc_log.level
    dvc_log.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        dvc_log.setLevel(level)


def _object_dirs(root: Path) -> list[Path]:
    """Where DVC keeps content-addressed objects for this repository: its cache, then a local-folder remote."""
    import configparser

    dirs = [root / ".dvc" / "cache"]
    for cfg_file in (root / ".dvc" / "config", root / ".dvc" / "config.local"):
        if not cfg_file.exists():
            continue
        cp = configparser.ConfigParser()
        cp.read(cfg_file)
        for section in cp.sections():
            if section.startswith(("'remote", "remote")) and "url" in cp[section]:
                url = cp[section]["url"]
                if "://" not in url:
                    dirs.append((cfg_file.parent / url).resolve() if not Path(url).is_absolute() else Path(url))
            if section == "cache" and "dir" in cp[section]:
                dirs.insert(0, (cfg_file.parent / cp[section]["dir"]).resolve())
    return dirs


def _object(base: Path, md5: str) -> Path:
    return base / "files" / "md5" / md5[:2] / md5[2:]


def restore(path: Path, md5: str, ignore: tuple[str, ...] = ()) -> bool:
    """Rebuild the folder DVC recorded as `md5` at `path`, from the DVC cache or a local remote.

    Needs no .dvc file (it may have been deleted with the folder): the `.dir` object lists every
    file's md5. The folder is rebuilt in a temporary sibling and renamed into place; an existing
    folder at `path` is replaced only if roboloop created it (moved aside). Returns False when the
    objects are not there (the caller recomputes).
    """
    import shutil

    from roboloop import fsutil

    root = find_root(path)
    if root is None or not md5.endswith(".dir"):
        return False
    for base in _object_dirs(root):
        listing = _object(base, md5)
        if not listing.is_file():
            continue
        entries = json.loads(listing.read_text())
        sources = [(_object(base, e["md5"]), e["relpath"]) for e in entries]
        if not all(src.is_file() for src, _ in sources):
            continue
        path = Path(path).absolute()
        kind = (fsutil.read_marker(path) or {}).get("kind", "restored")
        if path.exists() and not fsutil.is_ours(path):
            return False  # never replace what we did not create
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = fsutil.make_dir(fsutil.temp_sibling(path))
        try:
            for src, rel in sources:
                dst = tmp / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
            fsutil.publish(tmp, path, kind, overwrite=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return True
    return False
