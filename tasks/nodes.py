"""A training job on the gpu pool's nodes, one flow run of the `train-node` deployment per node (process workers,
one per GPU node, each taking one run at a time: `make worker-gpu`). The train task submits the runs, follows them
and stops them all when one fails; the runs show as the train task's subflows in the UI."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import cast

from prefect import get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.states import Cancelled

from roboloop.settings import settings
from roboloop.training.config import LaunchConfig
from roboloop.training.remote import NodeParams, node_params, run_node
from roboloop.training.runstore import JoinDoc
from tasks.common import NO_CACHE, relay
from tasks.control_plane import api_fault, ride_out

WAITING = {StateType.SCHEDULED, StateType.PENDING}
RESUBMITS = 3  # per node and job: a run that crashed before its flow began


def pool_nodes(launch: LaunchConfig) -> Callable[[JoinDoc], None]:
    """`stages.train`'s `nodes`: the job's nodes as runs of `launch.deployment`, awaited; a failed one fails all."""

    def run(job: JoinDoc) -> None:
        runs: list[FlowRun] = []
        try:
            params = [p.model_dump(mode="json") for p in node_params(job, launch)]
            log = get_run_logger()
            for k, p in enumerate(params):
                runs.append(ride_out(partial(submit, launch, p), f"submitting train-node {k} of {job.run_id}", log))
            follow(runs, params, launch, job, log)
        except BaseException:
            _cancel(runs)
            raise

    return run


def submit(launch: LaunchConfig, params: dict) -> FlowRun:
    """One node's run of `launch.deployment`, not awaited."""
    from prefect.deployments import run_deployment

    assert launch.deployment, "nodes are submitted to a deployment"
    return cast(FlowRun, run_deployment(launch.deployment, parameters={"params": params}, timeout=0))


def follow(runs: list[FlowRun], params: list[dict], launch: LaunchConfig, job: JoinDoc,
           log: logging.Logger | logging.LoggerAdapter) -> None:
    """Until every node's run completed. A run that fails or is not taken by a worker in time stops the job; one
    whose process crashed before its flow began (a worker starting it while the API was down) is submitted again,
    up to RESUBMITS times within the join timeout (the other nodes wait that long for it). `runs` holds the
    current run of each node."""
    start, said, again = time.monotonic(), set(), [0] * len(runs)

    def read() -> list[tuple[FlowRun, bool]]:
        with get_client(sync_client=True) as client:  # a new one each time: a restarted server, a new connection
            return [(r, _never_began(client, r)) for r in (client.read_flow_run(r.id) for r in runs)]

    while True:
        now = ride_out(read, f"following {job.run_id}'s node runs", log)
        for k, (r, unstarted) in enumerate(now):
            kind = r.state.type if r.state else StateType.SCHEDULED
            if kind == StateType.RUNNING and k not in said:
                said.add(k)
                log.info(f"{r.name}: running")
            if unstarted and again[k] < RESUBMITS and time.monotonic() - start < settings().join_timeout_s:
                again[k] += 1
                runs[k] = _again(r, launch, params[k], log, f"train-node {k} of {job.run_id}", again[k])
                continue
            if r.state and r.state.is_final() and kind != StateType.COMPLETED:
                raise RuntimeError(f"{r.name} ended {kind.value}: {r.state.message or 'see its log'}")
            if kind in WAITING and time.monotonic() - start > settings().join_timeout_s:
                raise TimeoutError(f"no worker of {launch.deployment}'s pool took train-node {k} of {job.run_id} "
                                   f"within {settings().join_timeout_s:.0f} s: run one worker per node "
                                   "(`make worker-gpu`), each with --limit 1")
        if all(r.state and r.state.type == StateType.COMPLETED for r, _ in now):
            return
        if launch.timeout_s and time.monotonic() - start > launch.timeout_s:
            raise TimeoutError(f"training {job.run_id} ran past launch.timeout_s={launch.timeout_s:g} s")
        time.sleep(2)


def _again(crashed: FlowRun, launch: LaunchConfig, params: dict, log: logging.Logger | logging.LoggerAdapter,
           what: str, n: int) -> FlowRun:
    run = ride_out(partial(submit, launch, params), f"submitting {what} again", log)
    log.warning(f"{what} ({crashed.name}) crashed before its flow began "
                f"({crashed.state.message if crashed.state else ''}): submitted again as {run.name} "
                f"({n} of {RESUBMITS})")
    return run


def _never_began(client, run: FlowRun) -> bool:
    """`run` CRASHED and was never RUNNING: its infrastructure failed before the flow's code (the node's training)
    started, so running it again loses nothing and repeats nothing."""
    if run.state is None or run.state.type != StateType.CRASHED:
        return False
    return not any(s.type == StateType.RUNNING for s in client.read_flow_run_states(run.id))


def _cancel(runs: list[FlowRun]) -> None:
    """Cancel the node runs not yet final; an API that fails for the grace period already is not asked again (the
    error that ended the job is the one raised)."""
    try:
        with get_client(sync_client=True) as client:
            for r in runs:
                state = client.read_flow_run(r.id).state
                if state is None or not state.is_final():
                    client.set_flow_run_state(r.id, Cancelled(message="another node of its job failed"), force=True)
    except Exception as e:
        if api_fault(e) is None:
            raise
        get_run_logger().error(f"could not cancel the job's node runs ({api_fault(e)}): cancel them in the UI")


@task(name="train-node", cache_policy=NO_CACHE)
def node_task(params: NodeParams) -> str:
    """This machine's part of a training job: node 0 leads, the others join (`roboloop.training.remote`)."""
    import socket

    out = run_node(params, on_line=relay(f"[node {params.node_rank}] "))
    return f"node {params.node_rank} of {params.run_id} on {socket.gethostname()}: {out}"
