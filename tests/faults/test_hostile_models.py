"""Model folders are data: a registry entry that names code to import (a LeRobot processor step's "class", a
family in policy.json) is refused before anything is imported, by `load_policy`, by the registry, and by a
server that follows the registry, which keeps serving the version it had."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from roboloop.policies import UnknownFamilyError, load_policy
from roboloop.policies.trust import UntrustedFolderError
from roboloop.registry import Registry, RegistryError
from tests.conformance.cases import LEROBOT_QUIET
from tests.models import lerobot_act_model, untrained_model

pytestmark = LEROBOT_QUIET
TOKEN = "h" * 32
MARKER_ENV = "ROBOLOOP_TEST_HOSTILE_MARKER"


class Boom:
    """A 'family' whose construction is the attack: it leaves a file behind."""

    def __init__(self) -> None:
        Path(os.environ[MARKER_ENV]).write_text("ran")


@pytest.fixture(scope="module")
def act(tmp_path_factory) -> Path:
    return lerobot_act_model(tmp_path_factory.mktemp("hostile") / "act")


def _plant_class_step(folder: Path, marker: Path) -> None:
    f = folder / "policy_preprocessor.json"
    cfg = json.loads(f.read_text())
    cfg["steps"].insert(0, {"class": "os.system", "config": {"command": f"touch {marker}"}})
    f.write_text(json.dumps(cfg))


def _lineage() -> dict:
    return {"git_commit": "abc123", "dataset_md5": "d41d8cd98f00b204e9800998ecf8427e.dir", "config": {"lr": 1e-3},
            "metrics": {"final_loss": 0.1}, "eval": {"successes": 9, "episodes": 10},
            "baseline_eval": {"successes": 0, "episodes": 10, "policy": "random"}}


def test_a_processor_step_naming_a_class_is_refused_before_it_runs(act, tmp_path):
    bad, marker = shutil.copytree(act, tmp_path / "bad"), tmp_path / "ran"
    _plant_class_step(bad, marker)
    with pytest.raises(UntrustedFolderError, match=r"policy_preprocessor.json: step 0 names the class 'os.system'"):
        load_policy(bad)
    assert not marker.exists()
    with pytest.raises(RegistryError, match="refusing to register arm: .*step 0 names the class"):
        Registry(tmp_path / "reg").register("arm", bad, _lineage())
    assert not marker.exists()
    assert load_policy(act).horizon == 5  # LeRobot's own folder (registered step names only) loads


@pytest.mark.parametrize("state_file", ["../../etc/passwd.safetensors", "/etc/x.safetensors", "x.pt"])
def test_a_state_file_outside_the_folder_is_refused(act, tmp_path, state_file):
    bad = shutil.copytree(act, tmp_path / "bad")
    f = bad / "policy_postprocessor.json"
    cfg = json.loads(f.read_text())
    cfg["steps"][-1]["state_file"] = state_file
    f.write_text(json.dumps(cfg))
    with pytest.raises(UntrustedFolderError, match="is not a .safetensors file name inside"):
        load_policy(bad)


def test_a_family_named_by_a_folder_is_not_imported(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv(MARKER_ENV, str(marker))
    folder = untrained_model(tmp_path / "m", 6, 3, 8)

    def name_family(name: str) -> None:
        (folder / "policy.json").write_text(json.dumps({
            "family": name, "state_key": "observation.state", "action_key": "action", "state_dim": 6,
            "action_dim": 3, "horizon": 8}))

    for name in ("os:abort", "sys:exit", "tests.faults.test_hostile_models:Boom"):
        name_family(name)
        with pytest.raises(UnknownFamilyError, match=f"policy family '{name}' is not allowed"):
            load_policy(folder)
    assert not marker.exists()
    # the operator's allow-list (never the folder) lets one in
    monkeypatch.setenv("ROBOLOOP_POLICY_FAMILIES", "tests.faults.test_hostile_models:Boom")
    with pytest.raises(UnknownFamilyError, match="lacks build"):
        load_policy(folder)
    assert marker.read_text() == "ran"


def test_a_server_following_the_registry_refuses_a_hostile_version_and_keeps_serving(act, tmp_path, monkeypatch):
    from roboloop.policies import trust
    from roboloop.serving.client import PolicyClient
    from roboloop.serving.server import ServeConfig, Server

    reg, marker = Registry(tmp_path / "registry"), tmp_path / "ran"
    reg.register("arm", act, _lineage())
    assert reg.promote("arm", 1).promoted
    bad = shutil.copytree(act, tmp_path / "bad")
    _plant_class_step(bad, marker)
    with monkeypatch.context() as m:  # someone who can write the registry's store bypasses roboloop's register
        m.setattr(trust, "check_processor_steps", lambda folder: None)
        reg.register("arm", bad, _lineage())
    assert reg.promote("arm", 2, force=True).promoted
    cfg = ServeConfig(f"registry:{reg.uri}#arm@champion", port=0, cache=str(tmp_path / "cache"))
    with pytest.raises(UntrustedFolderError):  # a hostile champion is refused at start
        Server(cfg, TOKEN)
    assert reg.promote("arm", 1, force=True).promoted
    cfg.follow_interval_s = 0.1
    state = np.zeros((1, 6), np.float32)
    images = {"observation.images.front": np.zeros((1, 32, 32, 3), np.uint8)}
    with Server(cfg, TOKEN) as srv, PolicyClient(f"serve://127.0.0.1:{srv.port}", token=TOKEN) as c:
        assert c.act(state, images).version.startswith("arm@v1+")
        assert reg.promote("arm", 2, force=True).promoted
        deadline = time.time() + 90  # the check runs in a child process: slow to start on a loaded 2-core machine
        while "arm@v2 refused" not in (r := c.act(state, images)).note and time.time() < deadline:
            time.sleep(0.1)
        assert r.version.startswith("arm@v1+") and "names the class 'os.system'" in r.note
    assert not marker.exists()


def test_state_folder_is_owner_only_and_the_token_is_checked_for_owner_and_links(tmp_path, monkeypatch):
    """DVC creates its site cache under .roboloop/ with mode 0777 (umask 0 here, as it was in a fresh clone): the
    folder is made owner-only before DVC writes there, and the token file is refused when it is a link, another
    user's, or in a folder others can write."""
    from roboloop.dvc import init_repo
    from roboloop.serving.token import read_token

    old = os.umask(0)
    try:
        init_repo(tmp_path)
        read_token(tmp_path / ".roboloop" / "serve-token", create=True)
    finally:
        os.umask(old)
    state = tmp_path / ".roboloop"
    assert state.stat().st_mode & 0o777 == 0o700
    os.chmod(state, 0o777)  # as a checkout from before this fix has it: tightened on the next read
    read_token(state / "serve-token")
    assert state.stat().st_mode & 0o777 == 0o700
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    (elsewhere / "tok").write_text("x" * 32)
    os.chmod(elsewhere / "tok", 0o600)
    link = state / "linked-token"
    link.symlink_to(elsewhere / "tok")
    with pytest.raises(PermissionError, match="must be a regular file, not a link"):
        read_token(link)
    os.chmod(elsewhere, 0o777)
    with pytest.raises(PermissionError, match="lets other users replace the policy-server token"):
        read_token(elsewhere / "tok")
    os.chmod(elsewhere, 0o755)
    if os.geteuid() == 0:  # root can hand the file to another user, as a local attacker's would be
        os.chown(elsewhere / "tok", 65534, 65534)
        with pytest.raises(PermissionError, match="belongs to user 65534"):
            read_token(elsewhere / "tok")


class AbortOnLoad:
    """A family the operator allowed whose loading kills its process (a native crash, an abort)."""

    name, capabilities = "abort-on-load", frozenset()

    def build(self, cfg, features): ...

    def load_init(self, trainable, folder, keys): ...

    def write_meta(self, out, trainable, info, data): ...

    def load(self, folder, device="cpu", seed=0, inference_steps=None):
        os.abort()


def test_a_version_that_kills_its_loader_is_checked_in_a_child_and_the_server_lives(tmp_path, monkeypatch):
    from roboloop.serving.client import PolicyClient
    from roboloop.serving.server import ServeConfig, Server

    monkeypatch.setenv("ROBOLOOP_POLICY_FAMILIES", "tests.faults.test_hostile_models:AbortOnLoad")
    reg = Registry(tmp_path / "registry")
    reg.register("arm", untrained_model(tmp_path / "v1", 6, 3, 8), _lineage())
    assert reg.promote("arm", 1).promoted
    bad = untrained_model(tmp_path / "v2", 6, 3, 8, seed=2)
    (bad / "policy.json").write_text(json.dumps({
        "family": "tests.faults.test_hostile_models:AbortOnLoad", "state_key": "observation.state",
        "action_key": "action", "state_dim": 6, "action_dim": 3, "horizon": 8}))
    reg.register("arm", bad, _lineage())
    cfg = ServeConfig(f"registry:{reg.uri}#arm@champion", port=0, cache=str(tmp_path / "cache"),
                      follow_interval_s=0.1)
    state = np.zeros((1, 6), np.float32)
    with Server(cfg, TOKEN) as srv, PolicyClient(f"serve://127.0.0.1:{srv.port}", token=TOKEN) as c:
        assert reg.promote("arm", 2, force=True).promoted
        deadline = time.time() + 60
        while "arm@v2 refused" not in (r := c.act(state)).note and time.time() < deadline:
            time.sleep(0.1)
        assert r.version.startswith("arm@v1+") and "in a child process failed" in r.note, r.note


def test_a_config_that_describes_more_than_its_weights_is_refused_under_a_memory_bound(tmp_path):
    """A config.json with large dimensions took the check child to 5.2 GB, and the server itself at start: loading
    now runs under a bound from the weights' size (4x plus 1 GiB), and past it the version is refused by name."""
    import resource

    from roboloop.procs import MemoryBoundError
    from roboloop.serving.service import load_slot

    folder = untrained_model(tmp_path / "big", 6, 3, 8)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model"].update(dim=4096, head_dim_model=4096, layers=48)  # ~38 GB of parameters for 1 MB of weights
    (folder / "config.json").write_text(json.dumps(cfg))
    before = resource.getrlimit(resource.RLIMIT_DATA)
    t0 = time.time()
    with pytest.raises(MemoryBoundError, match=r"loading arm@v9 \(\d+ MiB of weights\) needed more than 1\.\d GiB"):
        load_slot(folder, "arm@v9")
    assert time.time() - t0 < 60 and resource.getrlimit(resource.RLIMIT_DATA) == before
    slot = load_slot(untrained_model(tmp_path / "ok", 6, 3, 8), "arm@v1")  # a model as big as its weights loads
    assert slot.check_chunk.shape == (1, 8, 3)
