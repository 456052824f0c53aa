"""One Prefect test harness (a temporary SQLite server) for every flow test in the session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def prefect_harness(tmp_path_factory):
    import os

    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(tmp_path_factory.mktemp("prefect-results"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def dvc_repo(tmp_path, monkeypatch):
    """A scratch git + DVC repository with a local remote, as the working directory."""
    import subprocess

    from roboloop import dvc

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    dvc.init_repo(tmp_path, remote=str(tmp_path / ".remote"))
    monkeypatch.chdir(tmp_path)
    return tmp_path
