"""A concurrency lease outlives a Prefect server that stops or restarts (tasks/control_plane.py, infra/server.sh).

The server (infra/server.sh) on `control`, its client on `node-0`. Prefect 3.8.8 by itself renews a lease three times
in about 3 s and then cancels the run that holds it, and keeps leases in the server's memory, so a run of a deployment
with a concurrency limit (closed-loop-cluster: limit 1) was cancelled by a server down at its renewal or restarted
before it ("410 Gone"): hours of training lost to the control plane."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.cluster.conftest import hostservices as hs
from tests.cluster.services import PY

pytestmark = pytest.mark.slow
AUTH = "roboloop:leases"

_CLIENT = """
import json, logging, sys, threading, time, uuid
from prefect.client.orchestration import get_client
from prefect.concurrency import _leases
from tasks.control_plane import renew_lease
logging.basicConfig(level=logging.WARNING)
what = sys.argv[1]
with get_client(sync_client=True) as c:
    if what == "take":
        c.create_global_concurrency_limit(__import__("prefect.client.schemas.actions", fromlist=["x"])
                                          .GlobalConcurrencyLimitCreate(name="gpu-nodes", limit=1))
        r = c.increment_concurrency_slots_with_lease(names=["gpu-nodes"], slots=1, mode="concurrency",
                                                     lease_duration=120)
        print(json.dumps({"lease": str(r.json()["lease_id"])}))
    elif what == "renew":  # sys.argv[2]: roboloop's renewal or Prefect's own
        lease, t0, ours = uuid.UUID(sys.argv[3]), time.monotonic(), sys.argv[2] == "roboloop"
        try:
            fn = renew_lease if ours else _leases._renew_concurrency_lease_with_retries
            out = fn(c, lease, 120.0, threading.Event())
        except Exception as e:
            out = f"raised {type(e).__name__}: {e}"
        print(json.dumps({"renewed": out, "seconds": round(time.monotonic() - t0, 1)}))
    elif what == "held":
        print(json.dumps({"active": c.read_global_concurrency_limit_by_name("gpu-nodes").active_slots}))
"""


def _client(tb, what: str, *args: str, env: dict) -> dict:
    r = tb.run("node-0", [PY, "-c", _CLIENT, what, *args], env=env, cwd=hs.ROOT, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("hosts", [["control", "node-0"]], indirect=True)
def test_a_lease_outlives_a_server_that_stops_and_restarts_and_a_lost_one_never_cancels_the_run(hosts, work):
    db = f"sqlite+aiosqlite:///{work}/prefect.db"
    api = hs.prefect_server(hosts, "control", db, work, AUTH)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}, "PREFECT_API_URL": api,
           "PREFECT_API_AUTH_STRING": AUTH, "PREFECT_HOME": str(work / "client-home"), "PYTHONPATH": str(hs.ROOT)}
    lease = _client(hosts, "take", env=env)["lease"]

    # the server goes down: Prefect's renewal gives up in seconds (and would cancel the run); roboloop's waits
    hs.stop("control", "prefect")
    theirs = _client(hosts, "renew", "prefect", lease, env=env)
    assert str(theirs["renewed"]).startswith("raised ConnectError") and theirs["seconds"] < 10, theirs
    ours = hosts.popen("node-0", [PY, "-c", _CLIENT, "renew", "roboloop", lease], env=env, cwd=hs.ROOT,
                       stdout=-1, stderr=-1, text=True)
    time.sleep(5)
    hs.prefect_server(hosts, "control", db, work, AUTH)  # infra/server.sh: leases on disk
    out, err = ours.communicate(timeout=120)
    renewed = json.loads(out.strip().splitlines()[-1])
    assert renewed["renewed"] is True and renewed["seconds"] > 5, (renewed, err[-2000:])
    assert "renewed after" in err, err[-2000:]
    assert _client(hosts, "held", env=env)["active"] == 1  # the restarted server still counts the run's slot

    # a lease the server does not have (what a server that keeps leases in memory, Prefect's default, answers
    # after a restart: 410 Gone): Prefect's renewal raises (the run is cancelled); roboloop's says so in the log and
    # lets the run go on
    gone = "00000000-0000-4000-8000-000000000000"
    theirs = _client(hosts, "renew", "prefect", gone, env=env)
    assert "410" in str(theirs["renewed"]), theirs
    r = hosts.run("node-0", [PY, "-c", _CLIENT, "renew", "roboloop", gone], env=env, cwd=hs.ROOT, timeout=120)
    assert json.loads(r.stdout.strip().splitlines()[-1])["renewed"] is False, r.stdout + r.stderr
    assert "this run goes on" in r.stderr and "HTTPStatusError" in r.stderr, r.stderr[-2000:]
