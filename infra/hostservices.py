"""Services on test hosts, started as a team starts them: PostgreSQL (Debian's package) and the Prefect server on it
through `infra/server.sh`, moto's S3 server. Each waits until it answers over the testbed's network (it is asked from
a test host: nothing here sends from this machine's own network to a testbed address). Used by `make cluster-demo`
(infra/cluster_demo.py) and the cluster tests (tests/cluster)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
PG_PORT, PREFECT_PORT, S3_PORT = 5432, 4200, 9000
SERVICES: dict[tuple[str, str], subprocess.Popen] = {}  # (host, service) -> its process (the testbed kills them all)


def pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} not found: make install brings Debian's postgresql")
    return found[-1]


def wait_port(tb, client: str, host: str, port: int, timeout: float, proc: subprocess.Popen | None = None,
              log: Path | None = None) -> None:
    """Until `host:port` accepts a connection from `client` (a test host), or fail with the service's log tail."""
    deadline = time.time() + timeout
    probe = f"import socket; socket.create_connection(('{host}', {port}), 1)"
    while tb.run(client, [PY, "-c", probe]).returncode:
        if proc is not None and proc.poll() is not None or time.time() > deadline:
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{host}:{port} did not answer within {timeout:.0f} s: {tail}")
        time.sleep(0.5)


def postgres(tb, host: str, work: Path, database: str = "prefect") -> str:
    """PostgreSQL on `host` (its own data folder, as the `postgres` user), reachable by the testbed's hosts with a
    password; returns the database URL Prefect takes."""
    data = work / "pg-data"
    data.mkdir(parents=True)
    shutil.chown(work, "postgres")
    shutil.chown(data, "postgres")
    pw = work / "pg-pass"
    pw.write_text("roboloop-test\n")
    shutil.chown(pw, "postgres")
    subprocess.run(["runuser", "-u", "postgres", "--", pg_bin("initdb"), "-D", str(data), "-U", "roboloop",
                    "--pwfile", str(pw), "-A", "scram-sha-256"], check=True, capture_output=True)
    with open(data / "pg_hba.conf", "a") as f:
        f.write("host all all 198.18.0.0/15 scram-sha-256\n")  # the testbed's hosts, with the password
    start_postgres(tb, host, work)
    env = {**os.environ, "PGPASSWORD": "roboloop-test"}
    # the port opens before the server takes connections ("the database system is starting up"): ask again
    deadline = time.time() + 60
    while (r := tb.run(host, [pg_bin("createdb"), "-h", host, "-p", str(PG_PORT), "-U", "roboloop", database],
                       env=env)).returncode and "starting up" in r.stderr and time.time() < deadline:
        time.sleep(0.5)
    if r.returncode:
        raise RuntimeError(f"createdb failed: {r.stderr}")
    return pg_url(host, database)


def pg_url(host: str, database: str = "prefect") -> str:
    """The URL Prefect reaches `postgres`'s database by."""
    return f"postgresql+asyncpg://roboloop:roboloop-test@{host}:{PG_PORT}/{database}"


def start_postgres(tb, host: str, work: Path) -> None:
    """PostgreSQL on its data folder work/pg-data (made by `postgres`), again after `stop`: a restarted database."""
    log = work / "pg.log"
    with open(log, "a") as out:
        SERVICES[(host, "postgres")] = proc = tb.popen(
            host, ["runuser", "-u", "postgres", "--", pg_bin("postgres"), "-D", str(work / "pg-data"), "-c",
                   "listen_addresses=*", "-c", f"unix_socket_directories={work}", "-p", str(PG_PORT)],
            stdout=out, stderr=subprocess.STDOUT)
    wait_port(tb, host, host, PG_PORT, 60, proc, log)


def prefect_server(tb, host: str, db_url: str, work: Path, auth: str, env: dict[str, str] | None = None) -> str:
    """`infra/server.sh` on `host` (what `make server` runs), on PostgreSQL (or the database `db_url` names), bound
    to the host's address, with basic authentication, its home work/prefect-home; called again after `stop`, a
    restarted server. Returns its API URL."""
    log = work / "prefect-server.log"
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect-home"), "PREFECT_HOST": "0.0.0.0",
           "PREFECT_PORT": str(PREFECT_PORT), "PREFECT_API_DATABASE_CONNECTION_URL": db_url,
           "PREFECT_SERVER_API_AUTH_STRING": auth, "PREFECT_UI_ENABLED": "false", **(env or {})}
    with open(log, "a") as out:
        SERVICES[(host, "prefect")] = proc = tb.popen(host, [str(ROOT / "infra" / "server.sh")], stdout=out,
                                                      stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    wait_port(tb, host, host, PREFECT_PORT, 180, proc, log)
    return f"http://{host}:{PREFECT_PORT}/api"


def stop(host: str, service: str, timeout: float = 60) -> None:
    """Stop a service this module started on `host` ("postgres", "prefect", "moto"): SIGTERM to its process group
    (PostgreSQL: SIGINT, its fast shutdown; its smart one would wait for the server's connections), SIGKILL after
    `timeout`."""
    proc = SERVICES.pop((host, service))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT if service == "postgres" else signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def moto(tb, host: str, work: Path) -> str:
    log = work / "moto.log"
    with open(log, "w") as out:
        SERVICES[(host, "moto")] = proc = tb.popen(
            host, [str(Path(PY).parent / "moto_server"), "-H", "0.0.0.0", "-p", str(S3_PORT)], stdout=out,
            stderr=subprocess.STDOUT)
    wait_port(tb, host, host, S3_PORT, 60, proc, log)
    return f"http://{host}:{S3_PORT}"
