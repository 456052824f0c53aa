"""A rank that hangs (stopped, deadlocked: alive and silent) is found by its heartbeat and killed, so that torchrun
restarts the ranks from the last checkpoint (or, without restarts, the run fails naming it) in bounded time.

Without it a hung rank was found only by the others' collective timeout (`collective_timeout_s`, 600 s by default)
plus torchrun's 30 s grace for a process that does not stop on SIGTERM (bench/restart.py --fault stop: 42 s with a
10 s collective timeout). Each rank writes `<output>/.heartbeat/rank-N.json` as it enters a training step and as it
leaves it, and a thread in each rank watches its node's other ranks: one that has been inside a step for longer than
`max(ROBOLOOP_HANG_TIMEOUT_S, 10 x its median step)` is killed (SIGKILL, by its pid: a stopped process ends too).
Only the step is watched: saving a checkpoint, logging and validation between steps have the collective timeout,
and so does a rank's first step after each (re)start, which compiles the model's regions, initialises lazily and
sets up the first collectives: minutes for a large model (a compiled FSDP step on a busy 2-core machine took over
60 s and was killed as hung before this rule).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

FOLDER = ".heartbeat"


def hang_timeout_s() -> float:
    return float(os.environ.get("ROBOLOOP_HANG_TIMEOUT_S", "60"))


class Heartbeat:
    """This rank's heartbeat file, and the watch over its node's other ranks' (`watch()`, with more than one)."""

    def __init__(self, out: Path, rank: int):
        self.folder, self.rank = out / FOLDER, rank
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"rank-{rank}.json"
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.durations: collections.deque[float] = collections.deque(maxlen=21)
        self.started: float | None = None
        self.stop = threading.Event()
        self.killed: list[int] = []

    def _write(self, step: int, phase: str) -> None:
        median = sorted(self.durations)[len(self.durations) // 2] if self.durations else None
        tmp = self.path.with_suffix(f".tmp{self.pid}")
        tmp.write_text(json.dumps({"rank": self.rank, "pid": self.pid, "host": self.host, "step": step,
                                   "phase": phase, "time": time.time(), "step_s": median}))
        tmp.replace(self.path)

    def enter(self, step: int) -> None:
        """This rank starts step `step` (the watch times it from now)."""
        self.started = time.monotonic()
        self._write(step, "step")

    def leave(self, step: int) -> None:
        if self.started is not None:
            self.durations.append(time.monotonic() - self.started)
        self._write(step, "between")

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(OSError):
            self._write(-1, "done")

    def watch(self, every_s: float = 1.0) -> threading.Thread:
        t = threading.Thread(target=self._watch, args=(every_s,), name="hang-watch", daemon=True)
        t.start()
        return t

    def _watch(self, every_s: float) -> None:
        while not self.stop.wait(every_s):
            for peer in self.folder.glob("rank-*.json"):
                if peer == self.path:
                    continue
                with contextlib.suppress(OSError, ValueError):
                    self._judge(json.loads(peer.read_text()))

    def _judge(self, hb: dict) -> None:
        """Kill a peer on this host that has been inside one step for too long."""
        if hb.get("host") != self.host or hb.get("phase") != "step" or hb["pid"] in self.killed:
            return
        if hb.get("step_s") is None:  # its first step since it started: compiling, not hung (the collective timeout)
            return
        limit = max(hang_timeout_s(), 10 * (hb.get("step_s") or 0.0))
        age = time.time() - hb["time"]
        if age <= limit:
            return
        try:
            os.kill(hb["pid"], signal.SIGKILL)
        except ProcessLookupError:
            return
        self.killed.append(hb["pid"])
        print(f"rank {hb['rank']} (pid {hb['pid']}) made no progress in step {hb['step']} for {age:.0f} s (its "
              f"heartbeat; limit {limit:.0f} s = max(ROBOLOOP_HANG_TIMEOUT_S, 10 x its median step)): killed it, "
              "so that torchrun restarts the ranks from the last checkpoint", file=sys.stderr, flush=True)


def watched(out: Path, rank: int, world_size: int) -> Heartbeat | None:
    """This rank's heartbeat with its watch over its node's other ranks running; None for a run of one rank."""
    if world_size <= 1:
        return None
    beat = Heartbeat(out, rank)
    beat.watch()
    return beat
