"""Child processes that must not outlive their parent: torchrun and its ranks, simulator runs.

`run_streaming` starts the command in its own session (process group), hands every output
line to `on_line` as it arrives (Prefect tasks re-log them; child output reaches Prefect
only that way), and kills the *whole group* — SIGTERM, then SIGKILL — when the parent
raises, times out, or receives SIGTERM (what Prefect sends a cancelled flow run). A plain
`Popen.kill()` would leave torchrun's ranks running. `roboloop.warm.run_entry` is how every child stage starts
(simulator runs, recording, RL): `python -m roboloop.entry STAGE CONFIG.json` under `run_streaming`, or a warm
worker under the same rules.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, MutableMapping

from roboloop.errors import RoboloopError


def passive_waits(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """OpenMP threads that sleep while they wait (OMP_WAIT_POLICY=PASSIVE) unless the environment chose a policy.
    Read once, when torch's OpenMP runtime starts: set it in a child's environment, or in this process before torch
    is imported. Spinning threads that share a core with another busy process wait for a thread that has none: the
    demo's training beside one busy process ran at 30 samples/s instead of ~930 (bench/contention.py)."""
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to kill this process when its parent dies (Linux PR_SET_PDEATHSIG).

    Used as the initializer of worker pools: a `kill -9` of the parent otherwise leaves its workers
    running forever, re-parented to PID 1. A no-op where prctl is unavailable.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the child's process group, then SIGKILL what is left after `grace_s`."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        with contextlib.suppress(ProcessLookupError):  # the leader exited; its children may linger
            os.killpg(pgid, signal.SIGKILL)
        return


def _group_alive(proc: subprocess.Popen) -> bool:
    try:
        os.killpg(proc.pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _on_sigterm_kill(proc: subprocess.Popen):
    """A cancelled flow run / `kill`: take the child's whole group down with us, then let the host react as it
    would have (Prefect marks the run Cancelled). Returns the previous handler (None off the main thread)."""
    if not _main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)

    def _term(signum, frame):
        kill_group(proc, grace_s=5.0)
        if callable(previous):
            previous(signum, frame)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _term)
    return previous


def _pump(proc: subprocess.Popen) -> tuple[queue.Queue[str | None], threading.Thread]:
    """A thread that moves the child's output lines into a queue (None at the end)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    thread = threading.Thread(target=pump, daemon=True, name="roboloop-child-log")
    thread.start()
    return lines, thread


def relay(lines: queue.Queue[str | None], on_line: Callable[[str], None], tail: collections.deque[str],
          deadline: float | None, overdue: str, until: str | None = None) -> str | None:
    """Hand a child's lines to `on_line` (and `tail`) until its output ends (None) or a line starting with `until`
    comes (that line, not relayed); TimeoutError(`overdue`) once `deadline` (monotonic) has passed."""
    while True:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            line = ""
        if line is None:
            return None
        if until is not None and line.startswith(until):
            return line
        if line:
            tail.append(line)
            on_line(line)
        if deadline and time.monotonic() > deadline:
            raise TimeoutError(overdue)


def run_streaming(cmd: list[str], on_line: Callable[[str], None] = print, timeout_s: float | None = None,
                  env: dict[str, str] | None = None, what: str = "child process",
                  keep_last: int = 50) -> tuple[int, list[str]]:
    """Run `cmd`, streaming its merged stdout/stderr; returns (exit code, last `keep_last` lines)."""
    on_line("$ " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True, env=env)
    deadline = time.monotonic() + timeout_s if timeout_s else None
    previous = _on_sigterm_kill(proc)
    lines, pump = _pump(proc)
    atexit.register(kill_group, proc, 2.0)
    tail: collections.deque[str] = collections.deque(maxlen=keep_last)
    try:
        relay(lines, on_line, tail, deadline, f"{what} exceeded {timeout_s} s; killed its process group")
        code = proc.wait()
    finally:
        if proc.poll() is None or _group_alive(proc):
            kill_group(proc)
        pump.join(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()
        atexit.unregister(kill_group)
        if _main_thread() and previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return code, list(tail)


# What a child's line is worth in a run log: simulator and library chatter is DEBUG unless it is an error.
_CHATTER = re.compile(
    r"^(\[INFO\]|\t|\s{2,}\S|Finalize builder|Initialize solver|Module \S+ load|Warp \d|Warp CUDA warning|Warning: "
    r"|Failed to get root com velocity|.*\b(FutureWarning|DeprecationWarning|UserWarning|RuntimeWarning)\b"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING|DEBUG) (isaaclab|newton|warp|omni|pxr))")
_ERROR = re.compile(r"Traceback \(most recent call last\)|\b\w*Error\b|\bERROR\b|\bFATAL\b|Killed")


def log_level(line: str) -> int:
    """The logging level to relay a child's output line at: errors WARNING (the stage's own failure is
    raised separately), simulator/library chatter and machine-readable JSON lines DEBUG, the rest INFO."""
    s = line.rstrip()
    if _ERROR.search(s):
        return logging.WARNING
    if _CHATTER.match(s) or (s.startswith("{") and s.endswith("}")):
        return logging.DEBUG
    return logging.INFO


class ChildFailed(RoboloopError):
    """A simulator, recording or RL child process failed; the message carries its error line."""


@contextlib.contextmanager
def own_sigterm():
    """Keep this process's SIGTERM handler across `ray.init`, which installs Ray's own (`sys.exit`) and, in its core
    worker, a C++ failure-signal handler that ends the process a few seconds after a SIGTERM: a `roboloop serve
    --engine ray` stopped that way was gone before `serve.shutdown()` and `ray.shutdown()` finished, and Ray's
    dashboard and runtime-env agents outlived it. With the handler kept (the CLI's raises SystemExit), the caller's
    `finally` shuts Ray down."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


class MemoryBoundError(RoboloopError, MemoryError):
    """A step took more memory than its bound allows (a model whose config describes more than its weights hold)."""


def _vm_data() -> int:
    """This process's data size as the kernel counts it against RLIMIT_DATA (private writable memory), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmData in /proc/self/status")


@contextlib.contextmanager
def memory_bound(budget: int, what: str):
    """Run the body with at most `budget` more bytes of data memory (RLIMIT_DATA, soft, restored after); an allocation
    past it fails inside the body and comes out as MemoryBoundError naming `what` and the bound. Linux only (elsewhere
    the body runs unbounded). Meant for a step that runs alone (a model's load at start, a check child): other
    threads' allocations count against the same limit while it holds."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        limit = _vm_data() + budget
    except (OSError, ValueError, AttributeError):
        yield
        return
    limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        yield
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "memory" not in str(e).lower():
            raise
        raise MemoryBoundError(f"{what} needed more than {budget / 2**30:.1f} GiB, its bound; refused "
                               f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from None
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def load_budget(weights: int) -> int:
    """The memory a model's load and check may take: 4x its weights file plus 1 GiB (the model's parameters, a copy
    while loading, the check's activations), never more than 90% of what this machine has available."""
    import psutil

    return int(min(4 * weights + 2**30, 0.9 * psutil.virtual_memory().available))


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown when nothing is left to it: no child process and no thread but
    this one (a daemon thread excepted) still running; all outputs are written and closed by then. Finalizing
    Isaac Lab's, Warp's and torch's modules took ~3 s of each ~15 s simulator child here. Otherwise (a local Ray,
    an unfinished writer thread) this returns and the caller exits normally, so the exit handlers stop them."""
    import sys

    import psutil

    if psutil.Process().children() or any(t is not threading.main_thread() and t.is_alive() and not t.daemon
                                           for t in threading.enumerate()):
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
