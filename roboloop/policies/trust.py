"""What a model folder may ask of the process that loads it: data, never code.

Model folders come from the registry: a shared folder or an S3 prefix that more people and machines can write
than run the server. Two places would turn a folder's words into code:
- LeRobot's processor loader (`DataProcessorPipeline._resolve_step_class`, lerobot 0.6.1) imports and calls any
  `"class": "module.attr"` a step of `policy_preprocessor.json` names: `{"class": "os.system", "config":
  {"command": ...}}` runs a command. Steps LeRobot saves itself carry a `registry_name` (its
  `ProcessorStepRegistry`), which resolves only to classes LeRobot registered.
- a family named `module:Class` in `policy.json` would be imported and instantiated (`os:abort` kills a server).
So a folder's processor steps must name registered steps only, their state files must be plain names inside the
folder, and a family comes from roboloop itself, from an installed package's entry point (group
`roboloop.policy_families`), or from the operator's allow-list (`ROBOLOOP_POLICY_FAMILIES`), never from a folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

PROCESSOR_FILES = ("policy_preprocessor.json", "policy_postprocessor.json")  # what make_pre_post_processors reads
ENTRY_POINTS = "roboloop.policy_families"  # installed families: name = "package.module:Class"
STEP_KEYS = {"registry_name", "config", "state_file"}


class UntrustedFolderError(ValueError):
    """A model folder asks for something only code could do; the text names the file and the entry."""


def check_processor_steps(folder: str | Path) -> None:
    """Refuse a folder whose LeRobot processor files name anything but registered steps (no `"class"` paths), or
    point a step's state outside the folder. Runs before LeRobot reads them; imports nothing."""
    folder = Path(folder)
    for name in PROCESSOR_FILES:
        f = folder / name
        if not f.exists():
            continue
        if f.is_symlink() or not f.is_file():
            raise UntrustedFolderError(f"{f}: not a regular file (a link or a folder): refused")
        try:
            cfg = json.loads(f.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise UntrustedFolderError(f"{f} is not valid JSON ({e})") from e
        steps = cfg.get("steps") if isinstance(cfg, dict) else None
        if not isinstance(steps, list):
            raise UntrustedFolderError(f"{f}: no list of 'steps'")
        for i, step in enumerate(steps):
            _check_step(f, i, step, folder)


def _check_step(f: Path, i: int, step: object, folder: Path) -> None:
    where = f"{f}: step {i}"
    if not isinstance(step, dict):
        raise UntrustedFolderError(f"{where} is not an object")
    if "class" in step:
        raise UntrustedFolderError(f"{where} names the class {str(step['class'])[:120]!r} to import: a model folder "
                                   "may name only LeRobot's registered processor steps ('registry_name'); refused")
    if not isinstance(step.get("registry_name"), str):
        raise UntrustedFolderError(f"{where} has no 'registry_name' (LeRobot's registered processor step)")
    extra = sorted(set(step) - STEP_KEYS)
    if extra:
        raise UntrustedFolderError(f"{where} has unknown keys {extra}")
    state = step.get("state_file")
    if state is not None and (not isinstance(state, str) or os.sep in state or "/" in state
                              or state in ("", ".", "..") or not state.endswith(".safetensors")):
        raise UntrustedFolderError(f"{where}: state_file {state!r} is not a .safetensors file name inside {folder}")
    if state is not None and (folder / state).is_symlink():
        raise UntrustedFolderError(f"{where}: state_file {state} is a link: refused")


def installed_families() -> dict[str, str]:
    """Families installed packages offer (entry points of group `roboloop.policy_families`): name -> module:Class."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINTS)}


def allowed_families() -> set[str]:
    """`module:Class` families the operator allows (ROBOLOOP_POLICY_FAMILIES, comma-separated)."""
    from roboloop.settings import settings

    return {s.strip() for s in (settings().policy_families or "").split(",") if s.strip()}
