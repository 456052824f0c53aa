"""One real Prefect server (basic authentication on) with process workers for the `cpu` and `gpu` pools,
every deployment of deployments/prefect.yaml registered, shared by the deploy and browser tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

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


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
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
        for pool in ("cpu", "gpu"):
            procs.append(_spawn([*auth, PREFECT, "worker", "start", "--pool", pool, "--limit", "2"], env,
                                tmp / f"worker-{pool}.log"))
        yield {"api": api, "ui": api.removesuffix("/api"), "tmp": tmp,
               "env": {**env, "PREFECT_API_AUTH_STRING": ":".join(AUTH)}}
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's call report on its item (the browser fixture screenshots a failed test)."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep
