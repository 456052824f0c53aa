"""The test hosts themselves: names resolve to each host's own address, the S3 store on one host is reached from
two others by name and is the only state they share, a cut link times out (it is not refused), and teardown
leaves nothing, on failure too."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import hosts_possible, testbed

PY = sys.executable
MOTO = str(Path(sys.executable).parent / "moto_server")
S3_CLIENT = """
import socket, sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url="http://store:9000", aws_access_key_id="k", aws_secret_access_key="s",
                  region_name="us-east-1",
                  config=Config(connect_timeout=2, read_timeout=2, retries={"max_attempts": 1}))
op, key = sys.argv[1], sys.argv[2]
if op == "put":
    try:
        s3.create_bucket(Bucket="roboloop")
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    s3.put_object(Bucket="roboloop", Key=key, Body=socket.gethostname().encode())  # which host wrote it
else:
    print(s3.get_object(Bucket="roboloop", Key=key)["Body"].read().decode())
"""


def _wait_listening(tb, host: str, port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while tb.run(host, [PY, "-c", f"import socket; socket.create_connection(('{host}', {port}), 1)"]).returncode:
        assert time.time() < deadline, f"nothing listens on {host}:{port}"
        time.sleep(0.3)


def test_hosts_have_their_own_names_and_addresses_and_share_only_the_store(hosts):
    for name, addr in hosts.addresses.items():
        r = hosts.run(name, [PY, "-c", "import socket; h = socket.gethostname(); print(h, socket.gethostbyname(h))"])
        assert r.stdout.split() == [name, addr], r.stderr
    store = hosts.popen("store", [MOTO, "-H", "0.0.0.0", "-p", "9000"], stdout=subprocess_devnull(),
                        stderr=subprocess_devnull())
    _wait_listening(hosts, "store", 9000)
    put = hosts.run("node-0", [PY, "-c", S3_CLIENT, "put", "from-node-0"], timeout=60)
    assert put.returncode == 0, put.stderr
    got = hosts.run("node-1", [PY, "-c", S3_CLIENT, "get", "from-node-0"], timeout=60)
    assert got.returncode == 0 and got.stdout.strip() == "node-0", got.stderr  # written on node-0, read on node-1
    # a host has no route out of the testbed: nothing it sends can leave (refused locally, no packet sent)
    r = hosts.run("node-0", [PY, "-c", "import socket; socket.create_connection(('198.19.255.1', 9), 1)"])
    assert r.returncode != 0 and "Network is unreachable" in r.stderr, r.stderr[-300:]
    assert store.poll() is None


def test_a_cut_link_times_out_and_mending_it_restores_the_store(hosts):
    hosts.popen("store", [MOTO, "-H", "0.0.0.0", "-p", "9000"], stdout=subprocess_devnull(),
                stderr=subprocess_devnull())
    _wait_listening(hosts, "store", 9000)
    assert hosts.run("node-0", [PY, "-c", S3_CLIENT, "put", "k"], timeout=60).returncode == 0
    hosts.cut("store")
    t0 = time.time()
    r = hosts.run("node-0", [PY, "-c", S3_CLIENT, "get", "k"], timeout=60)
    assert r.returncode != 0 and ("timeout" in r.stderr.lower() or "timed out" in r.stderr.lower()), r.stderr[-500:]
    assert time.time() - t0 < 30
    hosts.mend("store")
    r = hosts.run("node-0", [PY, "-c", S3_CLIENT, "get", "k"], timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "node-0", r.stderr


def test_teardown_after_a_failure_leaves_nothing():
    why = hosts_possible()
    if why:
        pytest.skip(why)
    tb = testbed.Testbed(["a", "b"], tid=f"{testbed.PREFIX}fail")
    with pytest.raises(RuntimeError, match="planted"), tb:
        tb.popen("a", ["sleep", "600"])
        tb.popen("b", [PY, "-c", "import time; time.sleep(600)"])
        assert len(testbed.leftovers(tb.tid)) >= 3  # two hosts and the switch, their links
        raise RuntimeError("planted")
    assert testbed.leftovers(tb.tid) == []
    assert all(p.poll() is not None for p in tb.procs)


def subprocess_devnull():
    import subprocess

    return subprocess.DEVNULL
