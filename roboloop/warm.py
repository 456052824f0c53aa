"""Warm workers: the simulator stages (evaluate, collect) run in a long-lived child that has already imported torch,
Isaac Lab, Newton and Warp and, after its first stage, loaded their kernels, so the next stage starts in a fraction
of a second instead of ~5 s (bench/startup.py records both).

A worker is `python -m roboloop.entry --warm` (`roboloop.entry.warm_worker`), started like any stage child (its
own session; `run_streaming`'s rules) and kept between stages only while it has proved healthy:
- one stage at a time per worker; the parent streams its output lines as it does a cold child's;
- a stage that fails ends its worker (it exits with the stage's code, as a cold child does): the next stage gets a
  fresh one, so a crash, a hostile model or a half-built simulation never carries over;
- the parent's SIGTERM (a cancelled flow run), a timeout, or any exception in the parent kills the worker's whole
  process group, as for a cold child; an idle worker exits when its parent closes its stdin or dies;
- memory is bounded: a worker whose resident memory passed `WARM_MAX_RSS` after a stage, or that ran
  `WARM_MAX_JOBS` stages, exits instead of waiting for the next;
- a worker serves only a parent with the same environment, working directory and interpreter (`_key`), so a setting
  changed between stages is never missed.
No fork after the imports: Warp, CUDA and Isaac Lab's singletons are never shared between processes.
`ROBOLOOP_WARM_WORKERS=0` starts every stage cold (a new interpreter each time); N keeps up to N idle workers.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

MARK = "@@roboloop-warm"  # MARK <job id> <result JSON>: the stage's result line (the job id is the parent's secret)
WARM_STAGES = ("evaluate", "collect")  # torchrun ranks, RL (Ray) and the served model's check start cold
WARM_MAX_RSS = 6 * 2**30  # bytes resident after a stage beyond which a worker is not kept
WARM_MAX_JOBS = 50
IDLE_EXIT_S = 900.0  # an idle worker nobody asked for in this long exits on its own


def keep() -> int:
    """How many idle warm workers a process keeps (`ROBOLOOP_WARM_WORKERS`, default 1; 0: every stage cold)."""
    from roboloop.settings import settings

    return settings().warm_workers


def _key(env: dict[str, str]) -> str:
    blob = json.dumps([sys.executable, os.getcwd(), sorted(env.items())])
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class Worker:
    proc: subprocess.Popen
    key: str
    lines: queue.Queue  # its output lines (procs._pump), None at the end
    pump: threading.Thread
    jobs: int = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def reap(self) -> None:
        """After it exited: its output read to the end and its pipes closed."""
        self.proc.wait()
        self.pump.join(timeout=5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


class WarmPool:
    """This process's idle warm workers, the most recently used last; at most `keep()` of them (each holds its
    imports, ~0.6 GB here), the oldest retired first."""

    def __init__(self):
        self._idle: list[Worker] = []
        self._lock = threading.Lock()
        atexit.register(self.close)

    def _start(self, env: dict[str, str], key: str) -> Worker:
        proc = subprocess.Popen([sys.executable, "-m", "roboloop.entry", "--warm"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                start_new_session=True, env=env)
        from roboloop.procs import _pump

        return Worker(proc, key, *_pump(proc))

    def acquire(self, env: dict[str, str]) -> tuple[Worker, bool]:
        """An idle worker for this environment (warm: True) or a new one (False)."""
        key = _key(env)
        with self._lock:
            for w in reversed(self._idle):
                if w.key == key and w.alive():
                    self._idle.remove(w)
                    return w, w.jobs > 0
        return self._start(env, key), False

    def release(self, w: Worker) -> None:
        with self._lock:
            self._idle.append(w)
            dead = [x for x in self._idle if not x.alive()]
            live = [x for x in self._idle if x.alive()]
            retired, self._idle = live[:max(0, len(live) - keep())], live[max(0, len(live) - keep()):]
        for x in dead + retired:
            retire(x)

    def close(self) -> None:
        with self._lock:
            workers, self._idle = self._idle, []
        for w in workers:
            retire(w)


def retire(w: Worker) -> None:
    """Close an idle worker's stdin (it exits at once); kill its group if it does not."""
    from roboloop.procs import kill_group

    try:
        if w.proc.stdin is not None:
            w.proc.stdin.close()
        w.proc.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        pass
    kill_group(w.proc, grace_s=2.0)
    w.reap()


POOL = WarmPool()


def stage_env() -> dict[str, str]:
    from roboloop.procs import passive_waits

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    passive_waits(env)
    return env


def run_entry(stage: str, cfg, work, on_line: Callable[[str], None], timeout_s: float | None, what: str) -> dict:
    """`python -m roboloop.entry STAGE CONFIG.json` in a child process group (Isaac Lab keeps one simulation per
    process; a cancelled caller kills the simulator too). Returns the stage's JSON result; raises on failure."""
    from pathlib import Path

    from roboloop import fsutil
    from roboloop.procs import ChildFailed, run_streaming

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    cfg_file = fsutil.atomic_write_text(work / f"{stage}_config.json", cfg.model_dump_json(indent=2))

    result = None
    if stage in WARM_STAGES and keep() > 0:
        code, tail, result = run_warm(stage, str(cfg_file), on_line, timeout_s, what)
    else:
        cmd = [sys.executable, "-m", "roboloop.entry", stage, str(cfg_file)]
        code, tail = run_streaming(cmd, on_line, timeout_s, stage_env(), what=what)
    if code != 0:
        cause = next((ln for ln in reversed(tail) if ": " in ln and ln.split(":")[0].endswith("Error")), tail[-1:])
        raise ChildFailed(f"{what} failed (exit {code}): {cause if isinstance(cause, str) else ' | '.join(cause)}")
    return result if result is not None else json.loads(tail[-1])


def run_warm(stage: str, cfg_file: str, on_line: Callable[[str], None], timeout_s: float | None,
             what: str) -> tuple[int, list[str], dict | None]:
    """Run `stage` on a warm worker; (exit code, last lines, result). The worker goes back to the pool only after a
    stage that succeeded; on failure, timeout, SIGTERM or the caller's exception its process group is killed."""
    import collections

    from roboloop.procs import _main_thread, _on_sigterm_kill, kill_group, relay

    w, warm = POOL.acquire(stage_env())
    job = secrets.token_hex(8)
    on_line(f"$ [{'warm' if warm else 'new'} worker {w.proc.pid}] roboloop.entry {stage} {cfg_file}")
    previous = _on_sigterm_kill(w.proc)
    tail: collections.deque[str] = collections.deque(maxlen=50)
    deadline = time.monotonic() + timeout_s if timeout_s else None
    result, done = None, False
    try:
        assert w.proc.stdin is not None
        w.proc.stdin.write(json.dumps({"job": job, "stage": stage, "config": cfg_file}) + "\n")
        w.proc.stdin.flush()
        mark = relay(w.lines, on_line, tail, deadline, f"{what} exceeded {timeout_s} s; killed its process group",
                     until=f"{MARK} {job} ")
        result, done = (json.loads(mark.split(" ", 2)[2]), True) if mark is not None else (None, False)
    except (BrokenPipeError, OSError):
        done = False  # the worker died before it read the request: its exit code says why
    finally:
        if done:
            w.jobs += 1
            POOL.release(w)
        else:
            if w.alive():
                kill_group(w.proc)
            w.reap()
        if _main_thread() and previous is not None:
            import signal

            signal.signal(signal.SIGTERM, previous)
    return (0 if done else w.proc.returncode), list(tail), result
