"""What runs on the test hosts: the services (infra/hostservices.py: PostgreSQL, the Prefect server, moto's S3), a
dataset in S3, a Ray cluster."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.cluster.conftest import hostservices as _hs

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
PG_PORT, PREFECT_PORT, S3_PORT = _hs.PG_PORT, _hs.PREFECT_PORT, _hs.S3_PORT
pg_bin, wait_port, postgres, prefect_server, moto = (_hs.pg_bin, _hs.wait_port, _hs.postgres, _hs.prefect_server,
                                                     _hs.moto)


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


def start_nodes(tb, work: Path, run: str, commands: dict[str, list[str]], nproc: int = 1, restarts: int = 0,
                collective_timeout_s: float = 60, node0_disk: Path | None = None) -> list:
    """The nodes of training run `run` as a Kubernetes Job's pods start them: `commands` (host -> its command, node 0
    first: `roboloop train ...`, then `roboloop cluster join`), each host with a disk of its own, work/<run>/<host>
    (node 0's `node0_disk`: an earlier run's, a retried pod back on the same machine), sharing only the S3 run store;
    their output in work/<run>/<host>.log."""
    import subprocess

    nodes = list(commands)
    base = {"PATH": f"{Path(PY).parent}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0",
            "PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1", **S3_ENV, "ROBOLOOP_RUN_STORE": "s3://team/runs",
            "ROBOLOOP_RUN_ID": run, "ROBOLOOP_NNODES": str(len(nodes)), "ROBOLOOP_NPROC_PER_NODE": str(nproc),
            "ROBOLOOP_RDZV_ENDPOINT": f"{nodes[0]}:29400", "ROBOLOOP_MAX_RESTARTS": str(restarts),
            "ROBOLOOP_COLLECTIVE_TIMEOUT_S": str(collective_timeout_s), "ROBOLOOP_JOIN_TIMEOUT_S": "240"}
    (work / run).mkdir(parents=True, exist_ok=True)
    procs = []
    for i, (host, cmd) in enumerate(commands.items()):
        disk = node0_disk if node0_disk and i == 0 else work / run / host
        disk.mkdir(parents=True, exist_ok=True)
        with open(work / run / f"{host}.log", "w") as log:
            procs.append(tb.popen(host, cmd, cwd=disk, env={**base, "HOME": str(disk), "ROBOLOOP_NODE_RANK": str(i)},
                                  stdout=log, stderr=subprocess.STDOUT))
    return procs
