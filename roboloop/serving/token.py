"""The policy server's token: a file only its user can read (the Prefect server's convention in infra/server.sh),
never a flag, a parameter or a log line. The server creates it on first start; clients on the same machine read
it, a robot elsewhere gets a copy by the same means as an SSH key."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def token_path(path: str | Path | None = None) -> Path:
    from roboloop.settings import settings

    return Path(path or settings().serve_token_file)


def read_token(path: str | Path | None = None, create: bool = False) -> str:
    """The token in `path` (default `$ROBOLOOP_SERVE_TOKEN_FILE`); created (mode 600) when `create` and absent.
    A file others can read or replace is refused (a link, another user's file, mode beyond 600, a folder others
    can write): whoever reads the token can drive the robot, whoever replaces it can impersonate the server."""
    from roboloop import fsutil

    p = token_path(path)
    if not p.exists() and not p.is_symlink():
        if not create:
            raise FileNotFoundError(f"{p}: no policy-server token (the server creates it on its first start; copy "
                                    "it here or set ROBOLOOP_SERVE_TOKEN_FILE)")
        if p.parent.name == fsutil.STATE_ROOT:
            fsutil.private_dir(p.parent)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    if p.parent.name == fsutil.STATE_ROOT:
        fsutil.private_dir(p.parent)  # owner-only (tightened where DVC left it open)
    fsutil.check_private_file(p, "the policy-server token")
    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as f:
        token = f.read().strip()
    if len(token) < 16:
        raise ValueError(f"{p}: the token is shorter than 16 characters")
    return token
