"""Shared fixtures: generated datasets (real mp4s) and a moto S3 server on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")  # before anything imports mujoco (Newton does): offscreen rendering

from roboloop.datasets.generate import GenSpec, generate_v21  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

SMALL = GenSpec(num_episodes=6, min_length=10, max_length=20, seed=1)
LARGE = GenSpec(
    num_episodes=200,
    min_length=6,
    max_length=30,
    cameras={"observation.images.top": (32, 48), "observation.images.wrist": (24, 32)},
    image_keys={"observation.images.gripper": (32, 32)},
    noise=24,
    seed=3,
)


@pytest.fixture(scope="session")
def small_v21(tmp_path_factory) -> Path:
    return generate_v21(tmp_path_factory.mktemp("small") / "ds", SMALL)


@pytest.fixture
def small_copy(small_v21, tmp_path) -> Path:
    """A private copy a test may damage."""
    dst = tmp_path / "ds"
    shutil.copytree(small_v21, dst)
    return dst


@pytest.fixture(scope="session")
def large_v21(tmp_path_factory) -> Path:
    return generate_v21(tmp_path_factory.mktemp("large") / "ds", LARGE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_server():
    """A real moto S3 server process on 127.0.0.1 (HTTP, in-memory)."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        raise RuntimeError("moto server did not start")
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def s3_env(moto_server, monkeypatch):
    monkeypatch.setenv("ROBOLOOP_S3_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return moto_server


_HOME = pytest.StashKey[str]()


def pytest_configure(config):
    """A pytest-xdist worker gets a Prefect home of its own: two workers' ephemeral Prefect servers never share one
    SQLite database (each test that runs a flow in its own process starts one)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        import tempfile

        config.stash[_HOME] = tempfile.mkdtemp(prefix=f"roboloop-tests-prefect-{worker}-")
        os.environ["PREFECT_HOME"] = config.stash[_HOME]


def pytest_unconfigure(config):
    if home := config.stash.get(_HOME, None):
        shutil.rmtree(home, ignore_errors=True)


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the `xdist_group` marks
def pytest_collection_modifyitems(config, items):
    """Each hardware marker is paired with a runtime skip, so a plain `pytest` is green anywhere. In a pytest-xdist
    worker (`make test`) the longest work units go first (tests/schedule.py); in one process the benches' smoke
    tests go last: their runs start with the session (`bench_runs`) and they wait for them."""
    from tests.e2e.background import is_bench_item
    from tests.schedule import arrange, distributed

    needs = {"gpu": 1, "multigpu": 2}
    have = None
    for item in items:
        for marker, count in needs.items():
            if marker in item.keywords:
                have = _cuda_devices() if have is None else have
                if have < count:
                    item.add_marker(pytest.mark.skip(reason=f"needs {count} CUDA GPU(s), found {have}"))
    if distributed():
        arrange(items)
        return
    items[:] = [i for i in items if not is_bench_item(i)] + [i for i in items if is_bench_item(i)]


@pytest.fixture(scope="session", autouse=True)
def bench_runs(request, tmp_path_factory):
    """The selected benches' smoke runs, started with the session's first test (tests/e2e/background.py); in a
    pytest-xdist worker each runs when its test does (the workers keep the cores busy)."""
    from tests.e2e.background import BenchRuns, selected_benches
    from tests.schedule import distributed

    runs = BenchRuns(selected_benches(request.session.items), tmp_path_factory, background=not distributed())
    runs.start()
    yield runs
    runs.close()


@pytest.fixture(autouse=True)
def fair_scheduling(request):
    """Every test leaves this process time-shared (SCHED_OTHER). Found in a suite run: both test workers had turned
    SCHED_FIFO (priority 99) by its 20th minute (not roboloop's code; which test's library does it, this fixture
    names in the log), so a child that never sleeps (bench/contention.py's busy process) took a core from every
    other child pinned there, for good, and `nice` did nothing. A test that changes it is named and it is reset."""
    yield
    if hasattr(os, "sched_getscheduler") and os.sched_getscheduler(0) != os.SCHED_OTHER:
        policy = os.sched_getscheduler(0)
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        print(f"\n[scheduling] {request.node.nodeid} left this process at scheduling policy {policy} "
              "(1: SCHED_FIFO); reset to SCHED_OTHER", file=sys.__stderr__, flush=True)


_SESSION_START = time.monotonic()


@pytest.hookimpl(hookwrapper=True)
def pytest_report_teststatus(report, config):
    """With -v, each test's line also says how long its call took and when (minutes into the session) it ended,
    so a CI log cut short by a time limit still shows where the time went."""
    outcome = yield
    if report.when != "call":
        return
    category, letter, word = outcome.get_result()
    note = f" ({report.duration:.0f} s, at {(time.monotonic() - _SESSION_START) / 60:.1f} min)"
    if isinstance(word, tuple):
        outcome.force_result((category, letter, (word[0] + note, word[1])))
    elif word:
        outcome.force_result((category, letter, word + note))
