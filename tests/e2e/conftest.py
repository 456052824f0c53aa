"""The fresh-clone `make demo` starts when this folder's first test starts and runs beside the bench smoke tests.

Both are other processes that assert nothing about time: run one after the other they took 18 of CI's minutes,
much of it single-threaded start-up (imports, simulator children, installs) that leaves the second core idle.
The demo writes to a log file (a pipe nobody reads while the benches run would fill and stop it); its test
waits for it and reads the log."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import kill_leftovers

ROOT = Path(__file__).resolve().parents[2]
DEMO_TEST = "test_fresh_clone.py"


@dataclass
class BackgroundDemo:
    proc: subprocess.Popen
    log: Path
    tmp: Path
    started: float


@pytest.fixture(scope="package")
def fresh_clone_demo(request, tmp_path_factory):
    """The `.ci/fresh-clone-demo` process, started once for this folder (None when its test is not selected or
    this is not a git checkout)."""
    selected = any(item.path.name == DEMO_TEST for item in request.session.items)
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode == 0
    if not (selected and git):
        yield None
        return
    tmp = tmp_path_factory.mktemp("fresh-clone")
    log = tmp / "demo.log"
    with open(log, "w") as out:  # the child keeps its own descriptor
        # its own session: on a timeout the whole tree (make, the demo, its Prefect server) is killed
        proc = subprocess.Popen([str(ROOT / ".ci/fresh-clone-demo")], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env={**os.environ, "TMPDIR": str(tmp), "ROBOLOOP_DEMO_PRESET": "demo",
                                     "ROBOLOOP_FRESH_CLONE_REPRODUCE": "0", "COMPILE_BYTECODE": ""})
    try:
        yield BackgroundDemo(proc, log, tmp, time.monotonic())
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        kill_leftovers(str(tmp))


@pytest.fixture(autouse=True)
def _start_the_demo_first(fresh_clone_demo):
    """Every test of this folder asks for the demo, so it starts with the first of them."""
