"""Prefect's overhead per task run and per flow run, as roboloop uses them (targets <= 50 ms, <= 0.5 s).

    python bench/overhead.py [--tasks 200] [--flows 10]

Against the ephemeral server (`make demo`'s setting) or $PREFECT_API_URL if set. A task run's
overhead is (flow with N no-op task calls - same flow calling the functions) / N; a flow
run's is the wall time of an empty flow, after one warm-up run has started the server.
Both with our task options (cache key function, result persistence off), measured in the
embedded mode `make demo` uses (`flows.embedded()`: no flow-run heartbeats) and, for the flow
run, also with Prefect's defaults (`flow_overhead_default_s`). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tasks/ lives at the repository root

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from prefect import flow, task  # noqa: E402
from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

from flows import embedded  # noqa: E402
from tasks.common import NO_CACHE  # noqa: E402

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/overhead.py", "tasks", "flows"]


def work(i: int) -> int:
    return i * 2


noop_task = task(work, name="noop", cache_policy=NO_CACHE, persist_result=False)


@flow(name="bench-tasks")
def with_tasks(n: int) -> int:
    return sum(noop_task(i) for i in range(n))


@flow(name="bench-plain")
def plain(n: int) -> int:
    return sum(work(i) for i in range(n))


@flow(name="bench-empty")
def empty() -> None:
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--flows", type=int, default=10)
    args = ap.parse_args()
    t0 = time.perf_counter()
    empty()  # starts the ephemeral server
    startup = time.perf_counter() - t0
    default_times = []
    for _ in range(3):
        t = time.perf_counter()
        empty()
        default_times.append(time.perf_counter() - t)
    flow_times = []
    with embedded():
        for _ in range(args.flows):
            t = time.perf_counter()
            empty()
            flow_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        plain(args.tasks)
        base = time.perf_counter() - t
        t = time.perf_counter()
        with_tasks(args.tasks)
        tasks_s = time.perf_counter() - t
    task_ms = (tasks_s - base) / args.tasks * 1e3
    emit({"task_overhead_ms": round(task_ms, 2), "flow_overhead_s": round(statistics.median(flow_times), 3),
          "flow_overhead_p90_s": round(sorted(flow_times)[int(0.9 * (len(flow_times) - 1))], 3),
          "flow_overhead_default_s": round(statistics.median(default_times), 3),
          "server_startup_s": round(startup, 1), "tasks": args.tasks, "flows": args.flows,
          "api": os.environ.get("PREFECT_API_URL", "ephemeral")}, MEASURES)


if __name__ == "__main__":
    main()
