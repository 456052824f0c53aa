"""Run training under torchrun as a child process group: stream its output, kill it whole.

`run_torchrun` is what `roboloop train --nproc-per-node N` and the Prefect train task use.
torchrun starts in its own session (process group), so stopping it — an exception, Ctrl-C,
a SIGTERM from a cancelled flow run, a timeout — kills torchrun *and every rank* with one
`killpg`; nothing is left behind. Each output line goes to `on_line` as it arrives.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from roboloop.training.config import TrainConfig
from roboloop.training.distributed import torchrun_command


class LaunchConfig(BaseModel):
    """How many processes, on how many nodes (torchrun's c10d rendezvous)."""

    nproc_per_node: int = Field(1, ge=1, description="ranks on this node (GPUs, or CPU processes)")
    nnodes: int = Field(1, ge=1, description="nodes in the job")
    node_rank: int = Field(0, ge=0, description="this node's index")
    rdzv_endpoint: str = Field("127.0.0.1:29500", description="host:port of the rendezvous (node 0)")
    max_restarts: int = Field(0, ge=0, description="torchrun restarts of failed ranks (they auto-resume)")
    run_id: str = Field("roboloop", description="rendezvous id shared by all nodes of one job")
    timeout_s: float | None = Field(None, gt=0, description="kill the job after this many seconds")


class TrainingFailed(RuntimeError):
    pass


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
        # torchrun exited; its ranks may still be dying: make sure the group is empty
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        return


def run_torchrun(cfg: TrainConfig, launch: LaunchConfig, on_line: Callable[[str], None] = print,
                 env: dict[str, str] | None = None) -> Path:
    """Train `cfg` with torchrun on this node; returns the output folder. Raises on failure."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_file = out / "train_config.json"
    tmp = cfg_file.with_suffix(".tmp")
    tmp.write_text(cfg.model_dump_json(indent=2))
    tmp.replace(cfg_file)
    cmd = torchrun_command(str(cfg_file), launch.nproc_per_node, launch.nnodes, launch.node_rank,
                           launch.rdzv_endpoint, launch.max_restarts, launch.run_id)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if launch.nproc_per_node > 1 and "OMP_NUM_THREADS" not in child_env:
        child_env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // launch.nproc_per_node))
    on_line("$ " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True, env=child_env)
    deadline = time.monotonic() + launch.timeout_s if launch.timeout_s else None
    previous = signal.getsignal(signal.SIGTERM) if _main_thread() else None

    def _term(signum, frame):  # a cancelled flow run / `kill`: take the ranks down with us
        kill_group(proc, grace_s=5.0)
        raise SystemExit(128 + signum)

    if _main_thread():
        signal.signal(signal.SIGTERM, _term)
    lines: queue.Queue[str | None] = queue.Queue()

    def _pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    pump = threading.Thread(target=_pump, daemon=True, name="roboloop-torchrun-log")
    pump.start()
    atexit.register(kill_group, proc, 2.0)
    try:
        while True:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                line = ""
            if line is None:
                break
            if line:
                on_line(line)
            if deadline and time.monotonic() > deadline:
                raise TimeoutError(f"training exceeded {launch.timeout_s} s; killed torchrun and its ranks")
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
    if code != 0:
        raise TrainingFailed(f"torchrun exited with code {code}; see the log above (output in {out})")
    return out


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _group_alive(proc: subprocess.Popen) -> bool:
    try:
        os.killpg(proc.pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `roboloop train --nproc-per-node N`")
