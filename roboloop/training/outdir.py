"""Who owns a training output folder, and what a new run may do with it (no torch here).

A run claims its folder with `run_config.json` (its config plus the dataset's fingerprint) and
roboloop's marker. A later run with the same folder:
- resumes only when the config and the dataset match and the requested steps are beyond the
  latest checkpoint;
- finds a finished model of the same config and steps already there (nothing to do);
- is refused, with the difference named, in every other case: another config or dataset, fewer
  steps than the latest checkpoint, more steps than a finished model (that would replace it), a
  folder of files roboloop did not write.
`overwrite` moves a roboloop run folder aside (`NAME.replaced-TIMESTAMP`), never deletes it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from roboloop import fsutil
from roboloop.errors import OutputOwnershipError
from roboloop.training.config import TrainConfig

KIND = "train_run"
OWNER = "run_config.json"
CKPT_PREFIX = "step-"


@dataclass(frozen=True)
class Plan:
    action: Literal["fresh", "resume", "finished"]
    step: int = 0  # the checkpoint resumed from, or the finished run's steps
    moved_aside: Path | None = None


def dataset_fingerprint(root: str | Path) -> str:
    """Content identity of a dataset that is cheap to compute: its metadata files' bytes and its data and
    video files' names and sizes (a changed episode changes the metadata's lengths and stats)."""
    root = Path(root)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if not p.is_file() or any(part.startswith(".") for part in p.relative_to(root).parts):
            continue
        rel = p.relative_to(root).as_posix()
        h.update(f"{rel}\0{p.stat().st_size}\n".encode())
        if rel.startswith("meta/"):
            h.update(p.read_bytes())
    return h.hexdigest()[:32]


def latest_checkpoint_step(out: Path) -> int:
    ckpts = out / "checkpoints"
    steps = [int(p.name[len(CKPT_PREFIX):]) for p in ckpts.glob(f"{CKPT_PREFIX}*")
             if p.name[len(CKPT_PREFIX):].isdigit() and (p / "meta.json").exists()] if ckpts.is_dir() else []
    return max(steps, default=0)


def _saved(out: Path) -> dict:
    try:
        doc = json.loads((out / OWNER).read_text())
    except (OSError, ValueError) as e:
        raise OutputOwnershipError(f"{out / OWNER} is unreadable ({e}); choose another --output-dir") from e
    if not isinstance(doc, dict):
        raise OutputOwnershipError(f"{out / OWNER} is not a run config; choose another --output-dir")
    return doc


def plan(cfg: TrainConfig, fingerprint: str, overwrite: bool = False) -> Plan:
    """What this run may do with `cfg.output_dir`; raises OutputOwnershipError naming why it may not."""
    out = Path(cfg.output_dir)
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return Plan("fresh")
    if not out.is_dir() or not (out / OWNER).exists():
        raise OutputOwnershipError(f"{out} exists and holds files roboloop's trainer did not write (no {OWNER}); "
                                   "it is left untouched: choose another --output-dir")
    if {f.name for f in out.iterdir()} <= {OWNER, fsutil.MARKER}:  # claimed by a run refused before its first
        return Plan("fresh")  # step (a policy_config LeRobot rejects, say): nothing to keep; the fixed run takes it
    if overwrite:
        return Plan("fresh", moved_aside=move_aside(out))
    saved = _saved(out)
    changed = cfg.changed_fields(saved)
    if saved.get("dataset_fingerprint") not in (None, fingerprint):
        changed = ["dataset (its content differs)", *changed]
    if changed:
        raise OutputOwnershipError(f"{out} belongs to a run with different {', '.join(changed)}; {HINT}")
    return _same_run(cfg, out, saved)


HINT = "use another --output-dir, or --overwrite to move this run aside"


def _same_run(cfg: TrainConfig, out: Path, saved: dict) -> Plan:
    """The folder holds this run (same config and dataset): finished, resumable, or to start again."""
    hint = HINT
    step = latest_checkpoint_step(out)
    if (out / "model.safetensors").exists():
        done = int(saved.get("steps", -1))
        if done == cfg.steps:
            return Plan("finished", done)
        raise OutputOwnershipError(f"{out} holds a finished model of {done} steps; training {cfg.steps} steps "
                                   f"there would replace it: {hint}")
    if step:
        if not cfg.resume:
            raise OutputOwnershipError(f"{out} has checkpoints up to step {step} and resume is off: {hint}")
        if cfg.steps <= step:
            raise OutputOwnershipError(f"{out}: requested {cfg.steps} steps, but its latest checkpoint is already "
                                       f"at step {step}: ask for more steps, or {hint}")
        return Plan("resume", step)
    return Plan("fresh")  # our run, killed before its first checkpoint: start it again


def move_aside(out: Path) -> Path:
    """Move a roboloop run folder out of the way (never deleted)."""
    import os
    import secrets
    import time

    if not (out / OWNER).exists() and not fsutil.is_ours(out, KIND):
        raise OutputOwnershipError(f"{out} was not written by roboloop's trainer; it is left untouched")
    aside = out.with_name(f"{out.name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}")
    os.rename(out, aside)
    return aside


def claim(out: Path, cfg: TrainConfig, fingerprint: str) -> None:
    """Mark `out` as this run's (its config, dataset fingerprint and roboloop's marker)."""
    out.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_json(out / OWNER, {**cfg.model_dump(mode="json"), "dataset_fingerprint": fingerprint})
    if not fsutil.is_ours(out):
        fsutil.atomic_write_json(out / fsutil.MARKER, {"created_by": "roboloop", "kind": KIND})


def check_init_from(init: str | Path | None) -> None:
    """A model to continue from must be whole before this run claims its folder: its files present, its
    config readable, its weights' header intact (a truncated download otherwise fails deep in the run with
    safetensors' "incomplete metadata" and no path, leaving run_config.json claiming the folder)."""
    from roboloop.errors import CorruptFileError

    if not init:
        return
    init = Path(init)
    if not (init / "model.safetensors").is_file():
        raise FileNotFoundError(f"init_from {init}: missing model.safetensors; not a finished model")
    for f in ("policy.json", "config.json", "stats.json"):
        try:
            if (init / f).is_file():
                json.loads((init / f).read_text())
        except ValueError as e:
            raise CorruptFileError(f"init_from {init / f} is not valid JSON ({e})") from e
    from roboloop.policies import model_info

    model_info(init)  # a folder some family wrote
    from safetensors import safe_open

    try:
        with safe_open(str(init / "model.safetensors"), framework="np") as f:
            names = list(f.keys())
            if names:
                f.get_slice(names[-1])  # the last tensor's extent must lie inside the file
            size = (init / "model.safetensors").stat().st_size
        if size < 8:
            raise ValueError("file too short")
    except Exception as e:  # safetensors raises its own error types for truncated or garbled files
        raise CorruptFileError(f"init_from {init / 'model.safetensors'} cannot be read ({e}); download the model "
                               "again or retrain it") from e
