"""The policy server's token: a file only its user can read (the Prefect server's convention in infra/server.sh),
never a flag, a parameter or a log line. The server creates it on first start; clients on the same machine read
it, a robot elsewhere gets a copy by the same means as an SSH key."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


def token_path(path: str | Path | None = None) -> Path:
    from roboloop.settings import settings

    return Path(path or settings().serve_token_file)


def read_token(path: str | Path | None = None, create: bool = False) -> str:
    """The token in `path` (default `$ROBOLOOP_SERVE_TOKEN_FILE`); created (mode 600) when `create` and absent.
    A file others can read is refused: whoever reads the token can drive the robot."""
    p = token_path(path)
    if not p.exists():
        if not create:
            raise FileNotFoundError(f"{p}: no policy-server token (the server creates it on its first start; copy "
                                    "it here or set ROBOLOOP_SERVE_TOKEN_FILE)")
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    mode = stat.S_IMODE(p.stat().st_mode)
    if mode & 0o077:
        raise PermissionError(f"{p}: mode {mode:o} lets other users read the policy-server token; chmod 600 {p}")
    token = p.read_text().strip()
    if len(token) < 16:
        raise ValueError(f"{p}: the token is shorter than 16 characters")
    return token
