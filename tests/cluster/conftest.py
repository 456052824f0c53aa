"""Test hosts for the cluster tests (`infra/testbed.py`): network namespaces with their own addresses and host
names; every fixture tears down what it made, on failure too, and checks that nothing is left."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("roboloop_testbed", ROOT / "infra" / "testbed.py")
testbed = importlib.util.module_from_spec(_spec)  # infra/ is scripts, not a package
assert _spec.loader is not None
sys.modules["roboloop_testbed"] = testbed  # (dataclasses look their module up)
_spec.loader.exec_module(testbed)
_spec = importlib.util.spec_from_file_location("roboloop_k8s", ROOT / "infra" / "k8s.py")
k8s = importlib.util.module_from_spec(_spec)  # the gpu pool's manifests: render, validate, the pods of a Job
assert _spec.loader is not None
_spec.loader.exec_module(k8s)
_spec = importlib.util.spec_from_file_location("roboloop_hostservices", ROOT / "infra" / "hostservices.py")
hostservices = importlib.util.module_from_spec(_spec)  # PostgreSQL, the Prefect server, moto: as a team starts them
assert _spec.loader is not None
_spec.loader.exec_module(hostservices)


def hosts_possible() -> str | None:
    """Why test hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "test hosts need root (network namespaces); CI runs as root"
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "needs iproute2 and util-linux (make install)"
    return None


@pytest.fixture
def hosts(request):
    """A testbed of the hosts the test names (`@pytest.mark.parametrize("hosts", [[...]], indirect=True)`, default
    store, node-0, node-1), torn down after the test; the test fails if anything of it survives."""
    why = hosts_possible()
    if why:
        pytest.skip(why)
    names = getattr(request, "param", None) or ["store", "node-0", "node-1"]
    tid = f"{testbed.PREFIX}{os.getpid() % 100000}x{zlib.crc32(request.node.name.encode()) % 1000}"
    tb = testbed.Testbed(list(names), tid=tid)
    tb.up()
    try:
        yield tb
    finally:
        tb.down()
        left = testbed.leftovers(tb.tid)
        assert not left, f"the testbed left {left}"


@pytest.fixture
def work():
    """A folder of the test's own (the hosts' disks, logs, services' data), removed afterwards, on failure too."""
    import tempfile

    # short: Ray's socket paths under it must stay within the 107 bytes of a unix socket's name
    d = Path(tempfile.mkdtemp(prefix="roboloop-"))
    d.chmod(0o755)  # the postgres user (tests/cluster/test_cluster_loop.py) reaches its folder inside
    yield d
    shutil.rmtree(d, ignore_errors=True)
