"""A Prefect process worker that stops within seconds of SIGTERM or SIGINT, its runs cancelled and said so
(`make worker-cpu`, `make worker-gpu`, the test stack).

What Prefect 3.8.8's `prefect worker start` does on SIGTERM (it turns it into SIGINT), measured here
(tests/deploy/test_worker_stop.py): idle, it was still up 120 s later, so Kubernetes or systemd end it with SIGKILL
after their grace period and a stop looks like a crash; holding a run, it stopped in half a second and the run stayed
RUNNING in the UI, unreported, for the 300 s we watched. A run cannot outlive its process worker either: its output
goes through the worker, and killing the worker crashed the run ("aborted by Python system exit call").

So this runs the worker as a child and, on SIGTERM or SIGINT: marks the runs it holds (its child processes, matched
to the runs' infrastructure pids) CANCELLING with the reason, lets the worker cancel them as a cancellation from the UI
does (the run's processes stopped, the run CANCELLED: retry it from the UI), waits for that up to `--grace` seconds,
then kills the worker. A run is cancelled rather than finished because nothing can finish it once its worker is gone.

    python infra/worker.py [--grace S] -- prefect worker start --pool cpu [...]

Exits with the worker's own status when it ends by itself, 0 when it was stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LIVE = ("SCHEDULED", "PENDING", "RUNNING", "CANCELLING")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grace", type=float, default=20.0, help="seconds the held runs get to be cancelled (20)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the worker command")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if "--pool" not in command[:-1]:
        ap.error("give the worker command after --, e.g. -- prefect worker start --pool cpu")
    pool = command[command.index("--pool") + 1]
    worker = subprocess.Popen(command, start_new_session=True)
    asked: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _f: asked.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _f: asked.append(signum))
    while worker.poll() is None and not asked:
        time.sleep(0.2)
    if not asked:
        return worker.returncode
    name = signal.Signals(asked[0]).name
    t0 = time.monotonic()
    try:
        held = cancel_held(worker.pid, pool, f"its worker was stopped ({name}); run it again to retry")
    except Exception as e:  # the API unreachable: the worker still stops
        held = []
        say(f"{name}: could not cancel the runs this worker holds ({type(e).__name__}: {e})")
    while held and worker.poll() is None and time.monotonic() - t0 < args.grace and not final(held):
        time.sleep(0.5)
    with_runs = f"; {len(held)} run(s) it held cancelled: {', '.join(map(str, held))}" if held else ""
    if held:
        with contextlib.suppress(Exception):  # the reason in the run's final state, not "cancelled successfully"
            say_why(held, f"cancelled: its worker was stopped ({name}); run it again to retry")
    if worker.poll() is None:
        os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    say(f"{name}: worker stopped {time.monotonic() - t0:.1f} s after the signal{with_runs}")
    return 0


def say(message: str) -> None:
    print(f"[worker] {message}", file=sys.stderr, flush=True)


def children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (a process worker's flow runs)."""
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def cancel_held(worker_pid: int, pool: str, message: str) -> list:
    """Mark CANCELLING every live run of `pool` whose infrastructure pid is a child of the worker; their ids."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        WorkPoolFilter,
        WorkPoolFilterName,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling

    kids = {str(p) for p in children(worker_pid)}
    live = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType(s) for s in LIVE])))
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=live,
                                     work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool])))
        held = [r for r in runs if r.infrastructure_pid and r.infrastructure_pid.rsplit(":", 1)[-1] in kids]
        for run in held:
            client.set_flow_run_state(run.id, Cancelling(message=message), force=True)
    return [r.id for r in held]


def final(run_ids: list) -> bool:
    """Every run ended as the worker ends a cancelled one (or by itself). Crashed is not the end: the engine reports
    it on the termination signal, and the worker marks the run CANCELLED right after."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        states = [client.read_flow_run(i).state for i in run_ids]
    return all(s is not None and s.type.value in ("CANCELLED", "COMPLETED", "FAILED") for s in states)


def say_why(run_ids: list, message: str) -> None:
    """The worker ends a cancelled run with Prefect's own message; the runs that ended CANCELLED get the reason."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    with get_client(sync_client=True) as client:
        for i in run_ids:
            state = client.read_flow_run(i).state
            if state is not None and state.type.value == "CANCELLED":
                client.set_flow_run_state(i, Cancelled(message=message), force=True)


if __name__ == "__main__":
    sys.exit(main())
