"""What a registry version uploads from a model folder: its own files, never what a link points to."""

from __future__ import annotations

import os
from pathlib import Path


def model_files(src: Path, error: type[Exception]) -> list[Path]:
    """The files a version uploads: everything under `src` but checkpoints and hidden files. A link is refused, not
    followed: a link in a model folder once uploaded a 0600 secret from elsewhere and served it to every reader."""
    if src.is_symlink():
        raise error(f"refusing to register {src}: it is a link (to {os.readlink(src)}); pass the folder itself")
    files = []
    for p in sorted(src.rglob("*")):
        parts = p.relative_to(src).parts
        if "checkpoints" in parts or any(part.startswith(".") for part in parts):
            continue
        if p.is_symlink():
            raise error(f"refusing to register {src}: {p.relative_to(src)} is a link (to {os.readlink(p)}); "
                                "a version holds the folder's own files: copy what it needs into it")
        if p.is_file():
            files.append(p)
    return files
