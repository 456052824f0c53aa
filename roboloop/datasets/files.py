"""Which files a dataset has, and how they differ from what its metadata names.

Real datasets go wrong in ways that touch many files at once: videos in `video/` while the
template says `videos/`, a repository cloned without Git LFS (every parquet/jsonl/mp4 a
130-byte pointer), a chunk folder renamed. So files are looked for across the whole dataset
root, a missing file found elsewhere is reported with the path where it is, and one cause
that explains many files is reported once ("43 video files are under video/ instead of
videos/"), not once per file.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from roboloop.datasets import layout
from roboloop.datasets.report import Report

GROUP_OVER = 3  # more than this many files with one cause -> one line
_CHUNK_RE = re.compile(r"^chunk-\d+$")
_EP_RE = re.compile(r"episode_(\d+)")


def inventory(root: Path) -> list[str]:
    """Every regular file under `root` (POSIX, relative), hidden folders (.git, .cache, our temps) skipped."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel_dir = Path(dirpath).relative_to(root)
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            out.append((rel_dir / name).as_posix())
    return out


def scan_symlinks(root: Path, report: Report) -> set[str]:
    """Symlinks whose target leaves the dataset root are refused like `..` paths (reading them would read,
    and converting would copy, files outside the dataset). Returns them so later checks skip them."""
    bad = []
    real_root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            if p.is_symlink():
                target = p.resolve()
                if target != real_root and real_root not in target.parents:
                    bad.append(p.relative_to(root).as_posix())
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and not (Path(dirpath) / d).is_symlink()]
    for rel in bad:
        report.add("unsafe_path", f"symlink points outside the dataset (to {(root / rel).resolve()}); refused like "
                   "'..' paths", rel)
    return set(bad)


def scan_lfs_pointers(root: Path, files: list[str], report: Report) -> set[str]:
    """Report Git LFS pointer files once (with the fix); returns them so later checks skip them."""
    pointers = [rel for rel in files if layout.is_lfs_pointer(root / rel)]
    if pointers:
        examples = ", ".join(pointers[:3]) + (", ..." if len(pointers) > 3 else "")
        report.add("lfs_pointer", f"{len(pointers)} file(s) are Git LFS pointers (~130 bytes of text), not their "
                   f"content: the dataset was cloned without Git LFS. Run `git lfs install && git lfs pull` in "
                   f"{root} (e.g. {examples})", None if len(pointers) > 1 else pointers[0], count=len(pointers))
    return set(pointers)


def _video_key_parts(expected_rel: str, video_keys: list[str]) -> list[str]:
    parts = expected_rel.split("/")[:-1]
    return [p for p in parts if p in video_keys]


def _common_suffix(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _pattern(parts: list[str], video_keys: list[str]) -> str:
    """A folder as a pattern: chunk numbers and camera keys generalised, so one cause groups together."""
    out = ["chunk-*" if _CHUNK_RE.match(p) else "{video_key}" if p in video_keys else p for p in parts]
    return "/".join(out) or "."


def check_placement(root: Path, expected: Mapping[str, int | None], files: list[str], kind: str,
                    video_keys: list[str], report: Report, skip: set[str] = frozenset()) -> set[str]:  # type: ignore[assignment]
    """Missing, misplaced and extra `kind` files; returns the expected files that are present."""
    present = set(files)
    suffix = PurePosixPath(next(iter(expected), "x.parquet")).suffix
    missing = {rel: ep for rel, ep in expected.items() if rel not in present}
    tops = {rel.split("/")[0] for rel in expected}
    unexpected = [f for f in files if f.endswith(suffix) and f not in expected and f not in skip
                  and not f.startswith("meta/")]
    by_name: dict[str, list[str]] = defaultdict(list)
    for f in unexpected:
        by_name[PurePosixPath(f).name].append(f)
    moved: list[tuple[str, str, int | None]] = []  # (expected, found, episode)
    really_missing: dict[str, int | None] = {}
    for rel, ep in sorted(missing.items()):
        keys = _video_key_parts(rel, video_keys)
        exp_parts = rel.split("/")
        cands = [f for f in by_name.get(PurePosixPath(rel).name, []) if all(k in f.split("/")[:-1] for k in keys)]
        if cands:
            best = max(cands, key=lambda f: (_common_suffix(exp_parts, f.split("/")), f == cands[0]))
            by_name[PurePosixPath(rel).name].remove(best)
            moved.append((rel, best, ep))
        else:
            really_missing[rel] = ep
    _report_moved(moved, kind, video_keys, report)
    _report_missing(really_missing, len(expected), kind, video_keys, report)
    placed = {f for _, f, _ in moved}
    extra = [f for f in unexpected if f not in placed and f.split("/")[0] in tops]
    _report_extra(extra, kind, video_keys, report)
    return set(expected) - set(missing)


def _report_moved(moved: list[tuple[str, str, int | None]], kind: str, video_keys: list[str],
                  report: Report) -> None:
    groups: dict[tuple[str, str], list[tuple[str, str, int | None]]] = defaultdict(list)
    for exp, found, ep in moved:
        e, f = exp.split("/"), found.split("/")
        n = _common_suffix(e, f)
        groups[(_pattern(e[:-n], video_keys), _pattern(f[:-n], video_keys))].append((exp, found, ep))
    for (exp_dir, found_dir), items in groups.items():
        if len(items) == 1:
            exp, found, ep = items[0]
            report.add("misplaced_file", f"{kind} file expected here is at {found} (path does not match the "
                       "dataset's path template)", exp, ep)
            continue
        exp, found, _ = items[0]
        report.add("misplaced_file", f"{len(items)} {kind} files are under {found_dir}/ instead of {exp_dir}/ "
                   f"where info.json's path template puts them (e.g. {found} should be {exp}): move them, or fix "
                   "the template", exp_dir + "/", count=len(items))


def _report_missing(missing: dict[str, int | None], total: int, kind: str, video_keys: list[str],
                    report: Report) -> None:
    groups: dict[str, list[tuple[str, int | None]]] = defaultdict(list)
    for rel, ep in missing.items():
        groups[_pattern(rel.split("/")[:-1], video_keys)].append((rel, ep))
    for folder, items in groups.items():
        if len(items) <= GROUP_OVER:
            for rel, ep in items:
                report.add("missing_file", f"{kind} file is missing (not found anywhere in the dataset)", rel, ep)
            continue
        eps = [ep for _, ep in items if ep is not None]
        which = f" (episodes {', '.join(map(str, eps[:10]))}{', ...' if len(eps) > 10 else ''})" if eps else ""
        report.add("missing_file", f"{len(items)} of {total} {kind} files are missing under {folder}/{which}, "
                   f"and not found anywhere else in the dataset (e.g. {items[0][0]})", folder + "/",
                   count=len(items))


def _report_extra(extra: list[str], kind: str, video_keys: list[str], report: Report) -> None:
    groups: dict[str, list[str]] = defaultdict(list)
    for rel in extra:
        groups[_pattern(rel.split("/")[:-1], video_keys)].append(rel)
    for folder, items in groups.items():
        if len(items) <= GROUP_OVER:
            for rel in items:
                m = _EP_RE.search(rel)
                report.warn("extra_file", f"{kind} file not referenced by the metadata (ignored)", rel,
                            int(m.group(1)) if m else None)
            continue
        report.warn("extra_file", f"{len(items)} {kind} files under {folder}/ are not referenced by the metadata "
                    f"(ignored; e.g. {items[0]})", folder + "/", count=len(items))
