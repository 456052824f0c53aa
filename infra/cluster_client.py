"""What a person (or `make cluster-demo`) asks of a cluster's Prefect server and S3 store, run on one of its hosts
(PREFECT_API_URL, PREFECT_API_AUTH_STRING and the S3 settings in the environment):

    python infra/cluster_client.py run closed-loop/closed-loop-cluster       # a run as its schedule makes it; its id
    python infra/cluster_client.py follow ID [--timeout S]                     # its stages and nodes as they go
    python infra/cluster_client.py triggered closed-loop/closed-loop-cluster S3_URL --after T   # a trigger's run
    python infra/cluster_client.py summary reach-vla s3://roboloop/registry s3://roboloop/dvc   # what the runs left

`follow` prints one line per stage and node as it changes (with the host that ran it) and exits 0 when the run
completed, 1 with its failed runs' last log lines otherwise."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterName,
    FlowRunFilter,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterId,
    FlowRunFilterParentTaskRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.sorting import LogSort


def cmd_run(args) -> int:
    from prefect.deployments import run_deployment

    run = run_deployment(args.deployment, timeout=0)
    print(run.id)
    return 0


_WORKERS: dict = {}


def _host(c, r) -> str:
    """The worker that ran flow run `r` (its name says the host: gpu-node-0), from the run's first log lines."""
    if r.id not in _WORKERS:
        logs = c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id])),
                           sort=LogSort.TIMESTAMP_ASC, limit=5)
        found = next((m.group(1) for line in logs if (m := re.search(r"Worker '([^']+)' submitting", line.message))),
                     None)
        if found is None:
            return "?"
        _WORKERS[r.id] = found
    return _WORKERS[r.id]


def cmd_follow(args) -> int:
    """Progress of flow run ID and of the train-node runs it started, until it is final; an API that fails (its
    server restarting, its database down) is said and followed through."""
    import httpx

    said: dict[str, str] = {}
    deadline, down = time.time() + args.timeout, None
    while True:
        try:
            with get_client(sync_client=True) as c:  # a new one each time: a restarted server, a new connection
                done = _follow_step(c, args.id, said)
        except (httpx.TransportError, httpx.HTTPStatusError) as e:
            if isinstance(e, httpx.HTTPStatusError) and e.response.status_code < 500:
                raise
            if down is None:
                down = time.time()
                print(f"{time.strftime('%H:%M:%S')} the Prefect API failed ({type(e).__name__}); still following",
                      flush=True)
            done = None
        else:
            if down is not None:
                print(f"{time.strftime('%H:%M:%S')} the Prefect API answers again after {time.time() - down:.0f} s",
                      flush=True)
                down = None
        if done is not None:
            return done
        if time.time() > deadline:
            print(f"{args.id}: not final after {args.timeout} s")
            return 1
        time.sleep(2)


def _follow_step(c, run_id: str, said: dict[str, str]) -> int | None:
    """Print what changed; the exit status once the run is final, else None."""
    run = c.read_flow_run(run_id)
    rows = [(f"{run.name}", run, f" by {_host(c, run)}")]
    tasks = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
    children = c.read_flow_runs(flow_run_filter=FlowRunFilter(
        parent_task_run_id=FlowRunFilterParentTaskRunId(any_=[t.id for t in tasks]))) if tasks else []
    stand_ins = {f.parent_task_run_id for f in children}  # a subflow's task run: the subflow says it
    seen: dict[str, int] = {}
    for t in sorted(tasks, key=lambda t: t.expected_start_time or 0):
        if t.id not in stand_ins:
            name = re.sub(r"-[0-9a-f]{3}$", "", t.name)  # the stage's name (the task's, e.g. evaluate)
            seen[name] = seen.get(name, 0) + 1
            rows.append((f"  {name}" + (f" ({seen[name]})" if seen[name] > 1 else ""), t, ""))
    rows += [(f"    {f.name}", f, f" by {_host(c, f)}") for f in children]
    for label, obj, where in rows:
        state = obj.state.type.value if obj.state else "?"
        if state in ("SCHEDULED", "PENDING"):
            continue
        key = f"{state}{where if '?' not in where else ''}"
        if said.get(label) != key:
            said[label] = key
            print(f"{time.strftime('%H:%M:%S')} {label}: {key}", flush=True)
    if run.state and run.state.is_final():
        ok = run.state.type.value == "COMPLETED"
        if not ok:
            _tail(c, [run, *[f for _, f, w in rows if w and f.state and f.state.is_final()]])
        print(f"{run.name}: {run.state.type.value} {run.state.message or ''}".rstrip(), flush=True)
        return 0 if ok else 1
    return None


def _tail(c, runs, n: int = 25) -> None:
    for r in runs:
        logs = c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id])),
                           sort=LogSort.TIMESTAMP_DESC, limit=n)
        print(f"--- {r.name} (by {_host(c, r)}), last {len(logs)} log lines", file=sys.stderr)
        for line in reversed(logs):
            print(f"    {line.message}", file=sys.stderr)


def cmd_triggered(args) -> int:
    """The id of the first run of DEPLOYMENT with `source` = SOURCE expected after `--after` (an automation made it)."""
    from datetime import UTC, datetime

    after = datetime.fromtimestamp(args.after, UTC)
    deadline = time.time() + args.timeout
    with get_client(sync_client=True) as c:
        flow, _, name = args.deployment.partition("/")
        while time.time() < deadline:
            runs = c.read_flow_runs(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])),
                                    flow_run_filter=FlowRunFilter(
                                        expected_start_time=FlowRunFilterExpectedStartTime(after_=after)))
            found = [r for r in runs if r.parameters.get("source") == args.source]
            if found:
                print(found[0].id)
                return 0
            time.sleep(2)
    print(f"no run of {args.deployment} for {args.source} within {args.timeout} s", file=sys.stderr)
    return 1


def cmd_summary(args) -> int:
    """JSON: the registry's decisions for NAME, every flow run's host, and how many objects the DVC remote holds."""
    from roboloop.registry import Registry
    from roboloop.s3 import S3Uri, client, list_objects

    reg = Registry(args.registry)
    aliases, _ = reg.aliases(args.name)
    versions = {v: reg.lineage(args.name, v) for v in reg.versions(args.name)}
    evals = {v: {k: (lin.get("evaluation") or {}).get(k) for k in ("successes", "episodes", "ci_low", "ci_high")}
             for v, lin in versions.items()}
    dvc = [o.rel for o in list_objects(client(), S3Uri.parse(args.dvc_remote))]
    with get_client(sync_client=True) as c:
        runs = [{"name": r.name, "state": r.state.type.value if r.state else None, "worker": _host(c, r)}
                for r in c.read_flow_runs() if r.state and r.state.is_final()]
    print(json.dumps({"champion": aliases.get("champion"), "decisions": aliases.get("decisions", []),
                      "evals": evals, "sources": {v: (lin.get("raw") or {}).get("source")
                                                  for v, lin in versions.items()},
                      "model_md5": {v: lin.get("model_md5") for v, lin in versions.items()},
                      "dvc_keys": dvc, "runs": runs}))
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="cluster_client", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("deployment")
    r.set_defaults(fn=cmd_run)
    f = sub.add_parser("follow")
    f.add_argument("id")
    f.add_argument("--timeout", type=float, default=3600)
    f.set_defaults(fn=cmd_follow)
    t = sub.add_parser("triggered")
    t.add_argument("deployment")
    t.add_argument("source")
    t.add_argument("--after", type=float, default=0.0)
    t.add_argument("--timeout", type=float, default=300)
    t.set_defaults(fn=cmd_triggered)
    s = sub.add_parser("summary")
    s.add_argument("name")
    s.add_argument("registry")
    s.add_argument("dvc_remote")
    s.set_defaults(fn=cmd_summary)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
