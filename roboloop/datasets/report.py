"""What `validate` finds: defects (which refuse a dataset) and warnings (which don't).

A `Defect` names a code (the defect class), the file, the episode and the field, and how
many files it stands for when one cause explains many (`count`). Errors break training or
conversion (missing files, wrong row counts, shapes that disagree with the data); warnings
are quirks LeRobot itself accepts (float64 timestamps, `splits` that disagree with the
episode count, per-episode stats that must be computed) and are reported, never refused.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Defect:
    code: str
    message: str
    file: str | None = None
    episode: int | None = None
    field: str | None = None
    severity: Severity = "error"
    count: int = 1  # files this one line stands for (one cause, many files)

    def human(self) -> str:
        where = [p for p in (self.file, f"episode {self.episode}" if self.episode is not None else None,
                             f"field {self.field}" if self.field else None) if p]
        return f"[{self.code}] {' | '.join(where)}: {self.message}" if where else f"[{self.code}] {self.message}"


@dataclass
class Report:
    root: str
    version: str | None = None
    num_episodes: int = 0
    num_frames: int = 0
    defects: list[Defect] = field(default_factory=list)  # errors only
    warnings: list[Defect] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.defects

    def add(self, code: str, message: str, file: str | None = None, episode: int | None = None,
            field: str | None = None, count: int = 1) -> None:
        self.defects.append(Defect(code, message, file, episode, field, "error", count))

    def warn(self, code: str, message: str, file: str | None = None, episode: int | None = None,
             field: str | None = None, count: int = 1) -> None:
        self.warnings.append(Defect(code, message, file, episode, field, "warning", count))

    def extend(self, other: Report) -> None:
        self.defects.extend(other.defects)
        self.warnings.extend(other.warnings)

    def coalesce(self, over: int = 3) -> None:
        """One line for one cause: the same message in more than `over` files becomes a single entry."""
        self.defects = _coalesce(self.defects, over)
        self.warnings = _coalesce(self.warnings, over)

    def codes(self) -> set[str]:
        return {d.code for d in self.defects}

    def to_dict(self) -> dict:
        return {"root": self.root, "version": self.version, "ok": self.ok, "num_episodes": self.num_episodes,
                "num_frames": self.num_frames, "num_defects": len(self.defects),
                "defects": [asdict(d) for d in self.defects], "num_warnings": len(self.warnings),
                "warnings": [asdict(d) for d in self.warnings]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def human(self, limit: int = 200) -> str:
        head = f"{self.root} ({self.version or 'unknown version'}): {self.num_episodes} episodes, " \
               f"{self.num_frames} frames - "
        head += f"{len(self.defects)} defect(s)" if self.defects else "no defects"
        if self.warnings:
            head += f", {len(self.warnings)} warning(s)"
        lines = [head]
        lines += ["  " + d.human() for d in self.defects[:limit]]
        if len(self.defects) > limit:
            lines.append(f"  ... {len(self.defects) - limit} more (use --json for all)")
        lines += ["  warning " + d.human() for d in self.warnings[:limit]]
        if len(self.warnings) > limit:
            lines.append(f"  ... {len(self.warnings) - limit} more warnings (use --json for all)")
        return "\n".join(lines)


def _coalesce(items: list[Defect], over: int) -> list[Defect]:
    groups: dict[tuple, list[Defect]] = {}
    for d in items:
        key = (d.code, d.field, d.message) if d.file and d.count == 1 else (id(d),)
        groups.setdefault(key, []).append(d)
    out: list[Defect] = []
    for group in groups.values():
        if len(group) <= over:
            out.extend(group)
            continue
        first = group[0]
        eps = sorted({d.episode for d in group if d.episode is not None})
        which = f"episodes {', '.join(map(str, eps[:10]))}{', ...' if len(eps) > 10 else ''}; " if eps else ""
        out.append(Defect(first.code, f"{first.message} - in {len(group)} files ({which}e.g. {first.file})",
                          first.file.rsplit("/", 1)[0] + "/" if first.file and "/" in first.file else first.file,
                          None, first.field, first.severity, len(group)))
    return out


class DatasetDefectError(ValueError):
    """Raised by consumers (convert, ingest) that refuse a defective dataset; carries the report."""

    def __init__(self, report: Report):
        self.report = report
        super().__init__("dataset has defects:\n" + report.human(limit=50))


@dataclass
class Scan:
    """What the per-layout file checks share: the metadata, the report, the files found, the settings."""

    meta: Any
    report: Report
    deep: bool
    workers: int
    files: list[str]
    skip: set[str]  # files already reported (LFS pointers): not read again
