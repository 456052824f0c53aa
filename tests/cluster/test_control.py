"""The control host as a team runs it: PostgreSQL (Debian's) and the Prefect server on it (`infra/server.sh`, basic
auth), reached by name from the node hosts. A flow run on node-0 is read back on node-1 and is a row in
PostgreSQL on control: the only state the nodes share crossed the network."""

from __future__ import annotations

import json
import os

import pytest

from tests.cluster.services import PG_PORT, PY, pg_bin, postgres, prefect_server

pytestmark = pytest.mark.slow
AUTH = "roboloop:cluster-test-secret"
FLOW = """
from prefect import flow

@flow(name="hello-from-a-node")
def hello() -> str:
    import socket
    return socket.gethostname()

state = hello(return_state=True)
print(state.state_details.flow_run_id)
"""
READ = """
import asyncio, sys
from prefect.client.orchestration import get_client

async def main():
    async with get_client() as c:
        run = await c.read_flow_run(sys.argv[1])
        print(run.state.type.value, run.name)

asyncio.run(main())
"""


@pytest.mark.parametrize("hosts", [["control", "node-0", "node-1"]], indirect=True)
def test_prefect_on_postgres_on_control_serves_the_nodes_by_name(hosts, work):
    db = postgres(hosts, "control", work / "pg")
    api = prefect_server(hosts, "control", db, work, AUTH)
    assert api == "http://control:4200/api"

    def node_env(name: str) -> dict:
        return {**os.environ, "PREFECT_API_URL": api, "PREFECT_API_AUTH_STRING": AUTH,
                "PREFECT_HOME": str(work / f"home-{name}"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "DO_NOT_TRACK": "1"}

    ran = hosts.run("node-0", [PY, "-c", FLOW], env=node_env("node-0"), timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    run_id = ran.stdout.strip().splitlines()[-1]
    read = hosts.run("node-1", [PY, "-c", READ, run_id], env=node_env("node-1"), timeout=120)
    assert read.returncode == 0 and read.stdout.split()[0] == "COMPLETED", read.stderr[-2000:]
    rows = hosts.run("control", [pg_bin("psql"), "-h", "control", "-p", str(PG_PORT), "-U", "roboloop", "-d",
                                 "prefect", "-tAc", f"select name from flow_run where id = '{run_id}'"],
                     env={**os.environ, "PGPASSWORD": "roboloop-test"})
    assert rows.returncode == 0 and rows.stdout.strip() == read.stdout.split()[1], rows.stderr
    wrong = hosts.run("node-1", [PY, "-c", READ, run_id], env={**node_env("node-1"),
                                                               "PREFECT_API_AUTH_STRING": "roboloop:wrong"})
    assert wrong.returncode != 0 and "401" in wrong.stderr, wrong.stderr[-1000:]
    assert json.dumps(AUTH) not in (work / "prefect-server.log").read_text()  # the secret never reaches a log
