"""One real Prefect server (basic authentication on) with process workers for the `cpu` and `gpu` pools,
every deployment of deployments/prefect.yaml registered, shared by the deploy and browser tests.

The stack lives only as long as the tests of this folder (package scope), and nothing it started may
outlive it or compete with later tests for the cores: once the scheduler has shown it turns the cron
into runs, every schedule is paused and its runs deleted (a nightly closed loop due at 02:00 UTC, or the
10-minute dataset watch, must not start inside a CI run); at the end every unfinished flow run is
cancelled and any process still naming this stack's folder (its PREFECT_HOME) is killed with its group (the
process worker starts flow runs in sessions of their own, which killing the worker does not reach)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.processes import kill_leftovers

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
AUTH = ("roboloop", "test-only-secret")  # what infra/server.sh reads from .roboloop/prefect-auth


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="package")
def stack(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("prefect-stack")
    port = _port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp / "home"), "PREFECT_API_URL": api, "ROBOLOOP_HOME": str(REPO),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "PREFECT_LOGGING_LEVEL": "INFO",
           "ROBOLOOP_REGISTRY": str(tmp / "registry"), "PREFECT_WORKER_QUERY_SECONDS": "2",
           "ROBOLOOP_ARTIFACTS": str(tmp / "artifacts"), "ROBOLOOP_CACHE_DIR": str(tmp / "cache"),
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp}/prefect.db",
           "PREFECT_PORT": str(port), "ROBOLOOP_AUTH_FILE": str(tmp / "prefect-auth")}
    for k in ("PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING", "PREFECT_UI_API_URL"):
        env.pop(k, None)
    (tmp / "prefect-auth").write_text(":".join(AUTH))
    (tmp / "prefect-auth").chmod(0o600)
    # as `make server`, `make pools`, `make deploy` and `make worker-*` start them: the secret from the file
    procs = [_spawn(["bash", "infra/server.sh"], env, tmp / "server.log")]
    auth = ["bash", "infra/with-auth.sh"]
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"{api}/health", auth=AUTH, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise RuntimeError("prefect server did not start: " + (tmp / "server.log").read_text()[-3000:])
        subprocess.run([*auth, "infra/pools.sh"], cwd=REPO, env=env, check=True, capture_output=True)
        deploy = subprocess.run([*auth, PREFECT, "--no-prompt", "deploy", "--all", "--prefect-file",
                                 "deployments/prefect.yaml"], cwd=REPO, env=env, capture_output=True, text=True)
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
        registered, scheduled = _pause_schedules(api)
        for pool in ("cpu", "gpu"):
            procs.append(_spawn([*auth, sys.executable, "infra/worker.py", "--", PREFECT, "worker", "start", "--pool",
                                 pool, "--limit", "2"], env, tmp / f"worker-{pool}.log"))
        yield {"api": api, "ui": api.removesuffix("/api"), "tmp": tmp, "registered": registered,
               "scheduled": scheduled,
               "env": {**env, "PREFECT_API_AUTH_STRING": ":".join(AUTH)}}
    finally:
        # what slows the teardown goes to the terminal (CI's log), not to pytest's capture
        tr = request.config.pluginmanager.get_plugin("terminalreporter")
        say = (lambda m: tr.write_line(f"[deploy stack teardown] {m}")) if tr else print
        _cancel_unfinished(api, say)
        _stop(procs, say)
        kill_leftovers(str(tmp))


def _stop(procs: list[subprocess.Popen], say) -> None:
    """SIGTERM every group, then SIGKILL what is still there after 20 s; every child reaped (no "subprocess still
    running" at the end of the session)."""
    for p in reversed(procs):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            say(f"{p.args} ignored SIGTERM for 20 s; killed")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def api_call(method: str, url: str, **kw) -> httpx.Response:
    for _attempt in range(10):  # SQLite under load answers 503 now and then
        r = httpx.request(method, url, auth=AUTH, timeout=30, **kw)
        if r.status_code != 503:
            return r
        time.sleep(2)
    return r


def _runs_in(api: str, states: list[str]) -> list[dict]:
    r = api_call("POST", f"{api}/flow_runs/filter", json={"flow_runs": {"state": {"type": {"any_": states}}}})
    r.raise_for_status()
    return r.json()


def _pause_schedules(api: str) -> tuple[dict[str, dict], list[dict]]:
    """Wait (≤ 120 s) until the nightly cron has become scheduled runs, then pause every schedule and delete
    every scheduled run. Returns the deployments as registered (name -> JSON) and the runs seen."""
    deps = {d["name"]: d for d in api_call("POST", f"{api}/deployments/filter", json={}).json()}
    nightly = [d["id"] for d in deps.values() if d["name"] == "closed-loop"]
    deadline, scheduled = time.time() + 120, []
    while time.time() < deadline:
        scheduled = [r for r in _runs_in(api, ["SCHEDULED"]) if r["deployment_id"] in nightly]
        if scheduled:
            break
        time.sleep(2)
    for d in deps.values():
        for sched in d["schedules"]:
            r = api_call("PATCH", f"{api}/deployments/{d['id']}/schedules/{sched['id']}", json={"active": False})
            assert r.status_code in (200, 204), r.text
    for run in _runs_in(api, ["SCHEDULED"]):
        api_call("DELETE", f"{api}/flow_runs/{run['id']}")
    return deps, scheduled


def _cancel_unfinished(api: str, say) -> None:
    """Cancel every run not yet in a final state and give the workers ≤ 15 s to stop them (what is still running
    then is killed with its worker's process group and swept by `kill_leftovers`: the server goes away too)."""
    with contextlib.suppress(httpx.HTTPError):  # a dead server: the process sweep still kills what is left
        live = ["SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING"]
        for run in _runs_in(api, live):
            api_call("POST", f"{api}/flow_runs/{run['id']}/set_state",
                  json={"state": {"type": "CANCELLING"}, "force": True})
        deadline = time.time() + 15
        while (left := _runs_in(api, ["PENDING", "RUNNING", "CANCELLING"])) and time.time() < deadline:
            time.sleep(1)
        if left:  # CI's log shows which
            say(f"runs not stopped 15 s after cancelling: {[(r['name'], r['state']['type']) for r in left]}")
