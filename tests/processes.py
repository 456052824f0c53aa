"""Sweeping what a test started in sessions of its own (Prefect flow runs, training ranks, a demo's tree)."""

from __future__ import annotations

import os
import signal


def kill_leftovers(marker: str) -> None:
    """Kill every process whose command line or PREFECT_HOME mentions `marker` (a test's temporary folder), with
    its process group unless that group is pytest's own (then that process only)."""
    import psutil

    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid == os.getpid() or marker not in " ".join(p.cmdline()) + " " + p.environ().get("PREFECT_HOME", ""):
                continue
            group = os.getpgid(p.pid)
            if group == os.getpgrp():
                p.kill()
            else:
                os.killpg(group, signal.SIGKILL)
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue


def in_session(sid: int) -> list[str]:
    """The live (not zombie) processes of session `sid`, by command line: what a process started with
    `start_new_session=True` left behind once it exited."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(" ".join(p.cmdline())[:80])
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return found
