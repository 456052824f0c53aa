"""Ray across test hosts: a Ray cluster (head on node-0, a worker on node-1, token authentication as Ray 2.60 enables it
for a cluster), the policy server as a Ray Serve application with one replica on each host (`--replicas 2
--replicas-per-node 1`), its model from the S3 registry (each replica downloads it onto its own host). Robots act
through node-0's proxy; node-1's cable is pulled: the sessions on node-1's replica lose the request in flight (the
client's timeout), reconnect and go on against node-0's replica; the others usually never notice (not asserted:
under load, node-0's side too can miss the robots' 5 s timeout while Ray finds node-1 gone). A reconnect routed to the
lost replica before Serve's health check removes it is refused (counted apart: no request was sent on it).

Without a load balancer in front of the proxies (a Kubernetes Service does it for KubeRay), Serve's proxy would keep
every session on its own node's replica; RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING=0 lets node-0's proxy spread them
over both, so losing node-1 does hit sessions."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from roboloop.serving.token import read_token
from tests.cluster import services
from tests.cluster.services import S3_ENV
from tests.models import untrained_model

pytestmark = pytest.mark.slow
PY = sys.executable
# Serve removes a replica after 3 failed health checks in a row (REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD), each
# one failing at build_app's 6 s timeout every 2 s: up to ~24 s in which a reconnect can still land on the lost one.
# The robots act for 35 s after the cut, so each has time to be refused there and reconnect to node-0's (with 20 s,
# one robot in four runs here was refused to the end: ok_after 0).
CLIENTS, AFTER_CUT = 8, 35
ROBOT = r'''
import json, os, sys, time
import numpy as np
from roboloop.serving.client import PolicyClient
url, token, cut, stop = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]  # the test's flags: cable pulled, stop
ok_before = ok_after = 0
failures, c = [], None
state = np.zeros((1, 6), np.float32)
while not os.path.exists(stop):
    try:
        if c is None:
            c = PolicyClient(url, token=token, timeout=5.0).__enter__()
        c.act(state)
        if os.path.exists(cut):
            ok_after += 1
        else:
            ok_before += 1
            if ok_before == 1:
                print("acting", flush=True)
    except Exception as e:  # the request in flight when its replica's host was lost, or a session refused
        failures.append(f"{type(e).__name__}: {str(e)[:100]}")
        c = None
print(json.dumps({"ok_before": ok_before, "ok_after": ok_after, "failures": failures}), flush=True)
'''
PLACEMENT = ("import ray, ray._private.state as st; ray.init(address='node-0:6379'); "
             "nodes = {n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes()}; "
             "print(json.dumps(sorted(nodes[a['Address']['NodeID']] for a in st.actors().values() "
             "if a['State'] == 'ALIVE' and a['ActorClassName'].startswith('ServeReplica'))))")


@pytest.mark.parametrize("hosts", [["store", "node-0", "node-1", "robot"]], indirect=True)
def test_serving_goes_on_when_a_replica_host_is_lost(hosts, work):
    services.moto(hosts, "store", work)
    env = {**services.ray_env(), **S3_ENV, "ROBOLOOP_REGISTRY": "s3://team/registry",
           "ROBOLOOP_SERVE_TOKEN_FILE": str(work / "serve-token"), "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0"}
    token = read_token(work / "serve-token", create=True)  # a mounted Secret on a cluster: the same path everywhere
    model = untrained_model(work / "model", 6, 3, 8)
    r = hosts.run("node-0", [PY, "-c", "from roboloop.s3 import client; client().create_bucket(Bucket='team')"],
                  env=env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    add = hosts.run("node-0", [PY, "-m", "roboloop.cli", "registry", "add", "reach", str(model)], env=env, timeout=120)
    assert add.returncode == 0, add.stderr[-2000:]
    services.ray_cluster(hosts, work, env)
    with open(work / "serve.log", "w") as log:
        server = hosts.popen("node-0", [PY, "-m", "roboloop.cli", "serve", "registry:reach@1", "--engine", "ray",
                                        "--replicas", "2", "--replicas-per-node", "1", "--ray-address", "node-0:6379",
                                        "--host", "0.0.0.0", "--port", "8123"], env=env, cwd=work / "node-0",
                             stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while "listening on" not in (work / "serve.log").read_text():
        assert server.poll() is None and time.time() < deadline, (work / "serve.log").read_text()[-3000:]
        time.sleep(0.5)
    placed = hosts.run("node-0", [PY, "-c", "import json; " + PLACEMENT], env=env, timeout=120)
    assert json.loads(placed.stdout.splitlines()[-1]) == sorted([hosts.addresses["node-0"],
                                                                 hosts.addresses["node-1"]]), placed.stderr[-1500:]
    for host in ("node-0", "node-1"):  # each replica took the model from S3 onto its own host's disk
        assert list((work / host).rglob("serve-cache/server-*/reach/*/model.safetensors")), host
    cut, stop = work / "cut", work / "stop"
    robots = [hosts.popen("robot", [PY, "-c", ROBOT, "ws://node-0:8123", token, str(cut), str(stop)], env=env,
                          stdout=subprocess.PIPE, text=True) for _ in range(CLIENTS)]
    for p in robots:  # every robot acting before the cable is pulled (a loaded machine starts them slowly)
        assert p.stdout.readline().strip() == "acting", "a robot never acted"
    time.sleep(3)
    hosts.cut("node-1")
    cut.touch()
    time.sleep(AFTER_CUT)
    stop.touch()
    results = [json.loads(p.communicate(timeout=120)[0].splitlines()[-1]) for p in robots]
    failures = [f for r in results for f in r["failures"]]
    print(f"{CLIENTS} robots, node-1 lost: {sum('went away' in f for f in failures)} requests lost in flight, "
          f"{sum('no policy server answers' in f for f in failures)} reconnects refused; after the cut "
          f"{sum(r['ok_after'] for r in results)} answered")
    lost = [f for f in failures if "went away" in f]  # a request sent, and its answer never came
    refused = [f for f in failures if "no policy server answers" in f]  # a new session routed to the lost replica
    assert lost and len(lost) + len(refused) == len(failures), failures
    assert all(sum("went away" in f for f in r["failures"]) <= 1 for r in results), results  # only the one in flight
    assert all(r["ok_before"] > 0 and r["ok_after"] > 0 for r in results), results  # every robot goes on
    # Sessions on node-0's replica usually never notice, but not always: under make test's load on the CI machine all
    # 8 timed out once (node-0's side, too, did not answer within 5 s while Ray found node-1 gone). What a robot
    # relies on, and what is asserted above: one request lost at most, then it goes on.
    assert server.poll() is None
