"""What runs on the test hosts, started as a team starts it: PostgreSQL (Debian's package) and the Prefect server on
it through `infra/server.sh`, moto's S3 server. Each waits until it answers over the testbed's network."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
PG_PORT, PREFECT_PORT, S3_PORT = 5432, 4200, 9000


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
    data, log = work / "pg-data", work / "pg.log"
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
    with open(log, "w") as out:
        proc = tb.popen(host, ["runuser", "-u", "postgres", "--", pg_bin("postgres"), "-D", str(data), "-c",
                               "listen_addresses=*", "-c", f"unix_socket_directories={work}", "-p", str(PG_PORT)],
                        stdout=out, stderr=subprocess.STDOUT)
    wait_port(tb, host, host, PG_PORT, 60, proc, log)
    env = {**os.environ, "PGPASSWORD": "roboloop-test"}
    r = tb.run(host, [pg_bin("createdb"), "-h", host, "-p", str(PG_PORT), "-U", "roboloop", database], env=env)
    if r.returncode:
        raise RuntimeError(f"createdb failed: {r.stderr}")
    return f"postgresql+asyncpg://roboloop:roboloop-test@{host}:{PG_PORT}/{database}"


def prefect_server(tb, host: str, db_url: str, work: Path, auth: str) -> str:
    """`infra/server.sh` on `host` (what `make server` runs), on PostgreSQL, bound to the host's address, with basic
    authentication; returns its API URL."""
    log = work / "prefect-server.log"
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect-home"), "PREFECT_HOST": "0.0.0.0",
           "PREFECT_PORT": str(PREFECT_PORT), "PREFECT_API_DATABASE_CONNECTION_URL": db_url,
           "PREFECT_SERVER_API_AUTH_STRING": auth, "PREFECT_UI_ENABLED": "false"}
    with open(log, "w") as out:
        proc = tb.popen(host, [str(ROOT / "infra" / "server.sh")], stdout=out, stderr=subprocess.STDOUT, env=env,
                        cwd=ROOT)
    wait_port(tb, host, host, PREFECT_PORT, 180, proc, log)
    return f"http://{host}:{PREFECT_PORT}/api"


def moto(tb, host: str, work: Path) -> str:
    log = work / "moto.log"
    with open(log, "w") as out:
        proc = tb.popen(host, [str(Path(PY).parent / "moto_server"), "-H", "0.0.0.0", "-p", str(S3_PORT)],
                        stdout=out, stderr=subprocess.STDOUT)
    wait_port(tb, host, host, S3_PORT, 60, proc, log)
    return f"http://{host}:{S3_PORT}"


# S3 as the test hosts reach it (moto on `store`)
S3_ENV = {"ROBOLOOP_S3_ENDPOINT_URL": f"http://store:{S3_PORT}", "AWS_ACCESS_KEY_ID": "testing",
          "AWS_SECRET_ACCESS_KEY": "testing"}
_UPLOAD = """
import sys
from roboloop.s3 import client, upload_dir
client().create_bucket(Bucket="team")
upload_dir(sys.argv[1], "s3://team/datasets/pick")
"""
_LIST = """
from roboloop.s3 import client
s3 = client()
print("\\n".join(o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket="team")
                 for o in p.get("Contents", [])))
"""


def dataset_in_s3(tb, work: Path) -> Path:
    """A small camera dataset (v3) uploaded from node-0 to s3://team/datasets/pick on moto's server on `store`, as a
    team's data lands in S3; returns the local copy (for references trained on one host)."""
    from roboloop.datasets.convert import ConvertConfig, convert
    from roboloop.datasets.generate import GenSpec, generate_v21

    src = generate_v21(work / "v21", GenSpec(num_episodes=4, min_length=12, max_length=20,
                                            cameras={"observation.images.top": (32, 32)}, seed=6))
    v3 = convert(src, work / "v3", ConvertConfig(progress=False))
    moto(tb, "store", work)
    up = tb.run("node-0", [PY, "-c", _UPLOAD, str(v3)], env={**os.environ, **S3_ENV}, timeout=120)
    assert up.returncode == 0, up.stderr
    return v3


def s3_keys(tb) -> list[str]:
    """Every key in the `team` bucket, listed from node-0."""
    r = tb.run("node-0", [PY, "-c", _LIST], env={**os.environ, **S3_ENV}, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def ray_env() -> dict[str, str]:
    """A Ray cluster's environment on every host: Ray 2.60's token authentication with one token (a worker without
    the head's token cannot join)."""
    import secrets

    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32), "OMP_NUM_THREADS": "1"}


def ray_cluster(tb, work: Path, env: dict[str, str], hosts: tuple[str, ...] = ("node-0", "node-1")) -> None:
    """`ray start`: the head on hosts[0] (port 6379), a worker on each other host, 2 CPUs each, each started in its
    own folder work/<host> (its workers' working directory: that host's disk)."""
    for i, host in enumerate(hosts):
        disk = work / host
        disk.mkdir(exist_ok=True)
        start = ["--head", "--port", "6379", "--include-dashboard", "false"] if i == 0 else \
            ["--address", f"{hosts[0]}:6379"]
        r = tb.run(host, [str(Path(PY).parent / "ray"), "start", *start, "--node-ip-address", tb.addresses[host],
                          "--temp-dir", str(disk / "ray"), "--num-cpus", "2", "--disable-usage-stats"], env=env,
                   cwd=disk, timeout=180)
        assert r.returncode == 0, r.stderr[-2000:]
