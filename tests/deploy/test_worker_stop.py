"""A worker stopped as Kubernetes or systemd stops it (SIGTERM) while it holds a run: it exits within seconds, and
the run it held ends CANCELLED with the reason, its simulator stopped, as a cancellation from the UI ends it; nothing
is left RUNNING with no one to report it. (Prefect 3.8.8's own worker, stopped this way, left the run RUNNING for the
300 s this test waited; killed, it crashed the run: its output goes through the worker.) The worker is started as
`make worker-cpu` starts one (`infra/worker.py`), on a pool of its own so that it, and not the stack's workers, takes
the run."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.deploy.conftest import api_call
from tests.deploy.test_server_worker import _deployment, _wait

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
pytestmark = [pytest.mark.slow, pytest.mark.isaac]
KEEP = ("flow_id", "entrypoint", "path", "pull_steps", "parameter_openapi_schema", "enforce_parameter_schema")


def _own_deployment(api: str) -> str:
    """The evaluate deployment again, on the pool `drain`."""
    evaluate = _deployment(api, "evaluate/evaluate")
    body = {**{k: evaluate[k] for k in KEEP if k in evaluate}, "name": "evaluate-drain", "work_pool_name": "drain",
            "parameters": evaluate["parameters"]}
    assert api_call("POST", f"{api}/work_pools/", json={"name": "drain", "type": "process"}).status_code in (201, 409)
    r = api_call("POST", f"{api}/deployments/", json=body)
    assert r.status_code in (200, 201), r.text
    return r.json()["id"]


def test_sigterm_stops_the_worker_within_seconds_and_cancels_its_run_with_the_reason(stack):
    api, tmp = stack["api"], stack["tmp"]
    deployment = _own_deployment(api)
    params = {"params": {"policy": "expert", "eval": {"episodes": 24, "num_envs": 4, "videos": 0}}}
    run = api_call("POST", f"{api}/deployments/{deployment}/create_flow_run", json={"parameters": params}).json()["id"]
    log = tmp / "worker-drain.log"
    with open(log, "w") as f:
        worker = subprocess.Popen([sys.executable, "infra/worker.py", "--", PREFECT, "worker", "start", "--pool",
                                   "drain"], cwd=REPO, env=stack["env"], stdout=f, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        _wait(api, run, {"RUNNING"}, 180)
        deadline = time.time() + 120
        while "roboloop.entry evaluate" not in log.read_text():  # the simulator started
            assert time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        worker.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = worker.wait(30)
        took = time.monotonic() - t0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    text = log.read_text()
    assert rc == 0 and took <= 20, (rc, took, text[-3000:])  # 6 s here: the worker cancels the run, then stops
    assert re.search(r"\[worker\] SIGTERM: worker stopped .* 1 run\(s\) it held cancelled: " + run, text), text[-3000:]
    end = _wait(api, run, {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}, 60)
    message = api_call("GET", f"{api}/flow_runs/{run}").json()["state"]["message"]
    assert end == "CANCELLED" and message.startswith("cancelled: its worker was stopped (SIGTERM)"), \
        (end, message, text[-3000:])
    config = re.search(r"roboloop.entry evaluate (\S+evaluate_config.json)", text).group(1)
    time.sleep(2)
    left = [c for c in Path("/proc").glob("[0-9]*/cmdline") if _reads(c) and config in _reads(c)]
    assert not left, left  # the run's simulator stopped with it


def _reads(path: Path) -> str:
    try:
        return path.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
