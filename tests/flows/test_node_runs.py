"""tasks/nodes.py follows a training job's node runs on a real Prefect server (the session's test harness): a run
whose process crashed before its flow began is submitted again; one that crashed while it ran stops the job.

No worker runs here: the states a process worker reports are set on the runs by hand, as the worker's API calls
would set them. The cluster test (tests/cluster/test_cluster_loop.py) met the first case when PostgreSQL went down
while a node's worker started its run: "train-node ... ended CRASHED: Flow run infrastructure exited with non-zero
status code 1", and the loop failed with both nodes' trainings lost."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.states import Completed, Crashed, Pending, Running

from roboloop.training.config import LaunchConfig
from roboloop.training.runstore import JoinDoc
from tasks import nodes

CRASH = "Flow run infrastructure exited with non-zero status code 1."


@pytest.fixture
def deployment():
    """A `train-node`-like deployment on a pool no worker serves: its runs wait until the test moves them."""
    name = f"nodes-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as c:
        c.create_work_pool(WorkPoolCreate(name=name, type="process"))
        dep = c.create_deployment(flow_id=c.create_flow_from_name(name), name="nodes", work_pool_name=name)
    return f"{name}/nodes", dep


def _runs(dep) -> list:
    with get_client(sync_client=True) as c:
        runs = c.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep])))
    return sorted(runs, key=lambda r: r.created)


def _set(run, *states) -> None:
    with get_client(sync_client=True) as c:
        for s in states:
            c.set_flow_run_state(run.id, s, force=True)


def _until(dep, n: int, timeout_s: float = 60) -> list:
    t0 = time.monotonic()
    while len(runs := _runs(dep)) < n:
        assert time.monotonic() - t0 < timeout_s, f"{len(runs)} runs of the deployment, waited for {n}"
        time.sleep(0.2)
    return runs


def _follow(name: str) -> tuple[threading.Thread, dict]:
    """`pool_nodes`'s submit-and-follow for a two-node job, in a thread; what it raised, in the dict."""
    job = JoinDoc(run_id="job-1", config={}, dataset_url="s3://x/d", fingerprint="f", nnodes=2, nproc_per_node=1,
                  max_restarts=0)
    launch = LaunchConfig(nnodes=2, deployment=name)
    out: dict = {}

    def go() -> None:
        params = [{"node_rank": k} for k in range(2)]
        runs = [nodes.submit(launch, p) for p in params]
        try:
            nodes.follow(runs, params, launch, job, logging.getLogger("nodes"))
        except Exception as e:
            out["raised"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, out


def test_a_node_run_that_crashed_before_its_flow_began_is_submitted_again_and_the_job_completes(deployment, caplog):
    name, dep = deployment
    with caplog.at_level(logging.WARNING, logger="nodes"):
        t, out = _follow(name)
        first, second = _until(dep, 2)
        _set(first, Pending(), Crashed(message=CRASH))  # the worker started it; the process died before the flow
        _set(second, Pending(), Running())
        again = _until(dep, 3)[2]
        assert again.parameters == first.parameters == {"params": {"node_rank": 0}}
        _set(again, Pending(), Running(), Completed())
        _set(second, Completed())
        t.join(timeout=60)
    assert not t.is_alive() and "raised" not in out, out
    said = [r.getMessage() for r in caplog.records]
    assert any(f"({first.name}) crashed before its flow began" in m and again.name in m and "1 of 3" in m
               for m in said), said


def test_a_node_run_that_crashed_while_it_ran_stops_the_job_and_one_that_keeps_crashing_is_given_up(deployment):
    name, dep = deployment
    t, out = _follow(name)
    first, second = _until(dep, 2)
    _set(second, Pending(), Running())
    _set(first, Pending(), Running(), Crashed(message=CRASH))  # its training had begun: not repeated
    t.join(timeout=60)
    assert not t.is_alive() and "ended CRASHED" in str(out.get("raised")), out
    assert len(_runs(dep)) == 2

    t, out = _follow(name)  # a node whose process never starts: three more tries, then the job stops
    first, _ = _until(dep, 4)[2:]
    for k in range(nodes.RESUBMITS + 1):
        _set(first, Pending(), Crashed(message=CRASH))
        if k < nodes.RESUBMITS:
            first = _until(dep, 5 + k)[-1]
    t.join(timeout=60)
    assert not t.is_alive() and "ended CRASHED" in str(out.get("raised")), out
    assert len(_runs(dep)) == 4 + nodes.RESUBMITS
