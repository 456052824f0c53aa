"""The scheduled retraining across hosts: what `make cluster-demo` runs (infra/cluster_demo.py), at the quick sizes.

The Prefect server on PostgreSQL on `control`, S3 on `store`, a gpu-pool worker on each node and the cpu-pool worker
on node-1; each node its own checkout, sharing no folder. closed-loop-cluster runs as its schedule would: the flow
on the cpu pool, its training on both nodes (one train-node run each), its evaluation there, the model in the S3
registry and the DVC remote in S3. New episodes land in S3; watch-datasets announces them and the trigger runs the
loop again on them, which retrains on both nodes and gates against the champion (v1, made champion by hand: at these
sizes no policy is shown better than random)."""

from __future__ import annotations

import importlib.util
import re
import sys
import time

import pytest

from tests.cluster.conftest import ROOT

pytestmark = pytest.mark.slow
_spec = importlib.util.spec_from_file_location("roboloop_cluster_demo", ROOT / "infra" / "cluster_demo.py")
demo = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
sys.modules["roboloop_cluster_demo"] = demo
_spec.loader.exec_module(demo)


def falters(tb, work):
    """The control plane falters as the second run's train task starts: PostgreSQL down for 8 s (the server answers
    500), then the Prefect server stopped and started again (infra/server.sh), while the task submits the node
    runs and their workers start them, and on into their training. Before tasks/control_plane.py the loop's train
    task failed on its first poll and cancelled both node runs, which were training fine; before tasks/nodes.py
    submitted a run again, a node whose process crashed before its flow began (the API down) failed the loop."""

    hs = demo.hs  # the demo's own copy of infra/hostservices.py: it knows the services the demo started

    def fault() -> None:
        hs.stop("control", "postgres")
        time.sleep(8)
        hs.start_postgres(tb, "control", work / "pg")
        hs.stop("control", "prefect")
        hs.prefect_server(tb, "control", hs.pg_url("control"), work, demo.AUTH)

    return fault


@pytest.mark.parametrize("hosts", [demo.HOSTS], indirect=True)
def test_the_scheduled_retraining_runs_across_hosts_and_the_second_run_gates_against_the_champion(hosts, work):
    lines: list[str] = []
    s = demo.run(hosts, work, demo.QUICK, say=lines.append, force_first=True, fault=falters(hosts, work),
                 fault_when="train")
    progress = "\n".join(lines)

    # the registry in S3: v1 from the scheduled run, v2 from the dataset that arrived, gated against v1
    assert [d["version"] for d in s["decisions"]] == [1, 1, 2], s["decisions"]
    first, forced, second = s["decisions"]
    assert first["reason"].startswith("first version") and first["champion_before"] is None
    assert forced["promoted"] and forced["reason"].startswith("forced"), forced
    assert second["champion_before"] == 1 and "paired" in second["reason"], second
    assert s["sources"] == {"1": demo.SOURCE, "2": s["arrived"]}

    # both trainings ran on both nodes, each node its own worker; the loops and the watch on the cpu pool
    runs = s["runs"]
    assert all(r["state"] == "COMPLETED" for r in runs), runs
    jobs = {r["name"].split(" of ")[1].split(" on ")[0] for r in runs if r["name"].startswith("train-node")}
    assert len(jobs) == 2, runs  # one training job per loop
    named = 0
    for run_id in jobs:
        nodes = {(r["name"].split()[1], r["name"].rsplit(" on ", 1)[1], r["worker"]) for r in runs
                 if f" of {run_id} on " in r["name"]}
        assert {host for _, host, _ in nodes} == {"node-0", "node-1"}, nodes
        assert {rank for rank, _, _ in nodes} == {"0", "1"}, nodes
        # the worker is read from the run's "Worker ... submitting" log line, which an outage can drop (Prefect's
        # log shipping does not retry): "?" then, for the faulted job
        assert all(worker in (f"gpu-{host}", "?") for _, host, worker in nodes), nodes
        named += all(worker == f"gpu-{host}" for _, host, worker in nodes)
    assert named >= 1, runs  # the job that ran with the control plane up names both workers
    loops = [r for r in runs if r["name"].startswith("closed-loop")]
    assert len(loops) == 2 and {r["worker"] for r in loops} == {"cpu-node-1"}, loops
    assert any(r["name"] == f"watch {demo.INCOMING}" and r["worker"] == "cpu-node-1" for r in runs), runs

    # every model is in the DVC remote on S3 (DVC's content-addressed .dir object of the model folder)
    for v, md5 in s["model_md5"].items():
        assert md5 and f"files/md5/{md5[:2]}/{md5[2:]}" in s["dvc_keys"], (v, md5, s["dvc_keys"][:5])

    # progress a person sees: each stage, and which worker ran each node
    assert re.search(r"train-node 0 of \S+ on node-\d: RUNNING by gpu-node-\d", progress), progress[-3000:]
    assert "evaluate: COMPLETED" in progress and "register: COMPLETED" in progress, progress[-3000:]

    # the second run trained on through the faults: the follower saw the API fail before its nodes completed (their
    # runs said so once it answered again: deployments/prefect.yaml's client retries), and nothing was cancelled
    said = [i for i, line in enumerate(lines) if "the Prefect API failed" in line]
    back = [i for i, line in enumerate(lines) if "the Prefect API answers again" in line]
    done = [i for i, line in enumerate(lines) if re.search(r"train-node \d of \S+ on node-\d: COMPLETED", line)]
    assert said and back and said[0] < back[-1] and said[0] < done[-1], progress[-3000:]
    assert "Terminating execution" not in (work / "worker-cpu-node-1.log").read_text()

    # the server kept the secret out of its log; a wrong password is refused
    assert demo.AUTH not in (work / "prefect-server.log").read_text()
    env = {**demo.node_env(work, "node-0", "http://control:4200/api"), "PREFECT_API_AUTH_STRING": "roboloop:wrong"}
    r = hosts.run("node-0", [demo.PY, str(ROOT / "infra" / "cluster_client.py"), "run", demo.LOOP], env=env,
                  cwd=work / "node-0" / "roboloop", timeout=120)
    assert r.returncode != 0 and "401" in r.stdout + r.stderr, (r.stdout + r.stderr)[-1500:]
