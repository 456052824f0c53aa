"""One error type per cause, one line per error at the CLI, no traceback (that is behind -v)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tests.faults.conftest import (
    assert_no_debris,
    mount_tmpfs,
    one_line_error,
    run_cli,
    tree_hash,
    umount,
)

# ---------------------------------------------------------------- S3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_with_auth():
    """A moto server that checks credentials (INITIAL_NO_AUTH_ACTION_COUNT=0)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={"INITIAL_NO_AUTH_ACTION_COUNT": "0", "PATH": "/usr/bin:/bin"})
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


def _s3_env(endpoint: str, key: str | None = "testing") -> dict:
    env = {"ROBOLOOP_S3_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
           "AWS_CONFIG_FILE": "/nonexistent"}
    if key is not None:
        env |= {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": key}
    return env


@pytest.mark.s3
def test_s3_errors_are_named_by_cause(s3_env, s3_with_auth, tmp_path, monkeypatch):
    import boto3

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k, raising=False)
    bucket = f"b-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=s3_env, aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=bucket)
    cache = ["--cache-dir", tmp_path / "cache"]
    r = run_cli("ingest", f"s3://{bucket}/ds", *cache, env=_s3_env(s3_env, key=None))
    one_line_error(r, "no S3 credentials", "AWS_ACCESS_KEY_ID")
    r = run_cli("ingest", f"s3://{bucket}/ds", *cache, env=_s3_env(s3_with_auth, key="wrong"))
    one_line_error(r, "S3 refused the credentials", "InvalidAccessKeyId")
    r = run_cli("ingest", "s3://no-such-bucket-here/ds", *cache, env=_s3_env(s3_env))
    one_line_error(r, "bucket no-such-bucket-here does not exist")
    closed = f"http://127.0.0.1:{_free_port()}"
    r = run_cli("ingest", f"s3://{bucket}/ds", *cache, env=_s3_env(closed))
    one_line_error(r, f"cannot reach {closed}", "ROBOLOOP_S3_ENDPOINT_URL")
    r = run_cli("ingest", f"s3://{bucket}/empty", *cache, env=_s3_env(s3_env))
    one_line_error(r, "no objects under")
    assert_no_debris(tmp_path)


@pytest.mark.s3
def test_missing_object_in_an_s3_registry(tiny_model, s3_env, tmp_path):
    import boto3

    from roboloop.registry import Registry
    from tests.faults.conftest import lineage

    bucket = f"reg-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=s3_env)
    client.create_bucket(Bucket=bucket)
    reg = Registry(f"s3://{bucket}/registry")
    reg.register("m", tiny_model, lineage())
    client.delete_object(Bucket=bucket, Key="registry/m/versions/v000001/files/model.safetensors")
    r = run_cli("registry", "download", "m", "1", "--registry", f"s3://{bucket}/registry", "--dst", tmp_path / "dl",
                env=_s3_env(s3_env))
    one_line_error(r, "object not found")
    assert not (tmp_path / "dl").exists()
    assert_no_debris(tmp_path)


# ---------------------------------------------------------------- disks


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, "40k")
    yield mnt
    umount(mnt)


def test_disk_full_during_convert(v21_dataset, small_disk, tmp_path):
    before = tree_hash(v21_dataset)
    r = run_cli("convert", v21_dataset, small_disk / "out", "--no-progress")
    one_line_error(r, "no space left on the device")
    assert not (small_disk / "out").exists() and tree_hash(v21_dataset) == before
    assert_no_debris(small_disk)


def test_disk_full_at_the_final_save_of_train(v3_dataset, tmp_path):
    mnt = tmp_path / "disk"
    mount_tmpfs(mnt, "600k")
    try:
        r = run_cli("train", "--dataset", v3_dataset, "--output-dir", mnt / "run", "--steps", "2",
                    "--checkpoint-every-steps", "0", "--max-tokens", "512")
        one_line_error(r, "no space left on the device", "model.safetensors")
        assert not (mnt / "run" / "model.safetensors").exists()
        assert_no_debris(mnt)
    finally:
        umount(mnt)


def test_read_only_destination(v21_dataset, tmp_path):
    mnt = tmp_path / "ro"
    mount_tmpfs(mnt, "1m", readonly=True)
    try:
        one_line_error(run_cli("convert", v21_dataset, mnt / "out"), "read-only file system")
        one_line_error(run_cli("convert", v21_dataset, mnt / "sub" / "out"), "read-only file system")
    finally:
        umount(mnt)


# ---------------------------------------------------------------- registry metadata


def test_corrupt_lineage_is_named_and_the_rest_still_works(registry, tmp_path):
    (registry.store.root / "reach-vla/versions/v000001/lineage.json").write_text("{not json")
    r = run_cli("registry", "show", "reach-vla", "1", "--registry", registry.uri)
    one_line_error(r, "reach-vla v1: lineage.json is corrupt")
    r = run_cli("registry", "list", "--registry", registry.uri)
    assert r.code == 0 and "lineage.json is corrupt" in r.out
    assert run_cli("registry", "download", "reach-vla", "2", "--registry", registry.uri, "--dst",
                   tmp_path / "dl").code == 0


def test_deleted_committed_marker(registry, tmp_path):
    (registry.store.root / "reach-vla/versions/v000002/COMMITTED.json").unlink()  # v2 is the champion
    r = run_cli("registry", "download", "reach-vla", "champion", "--registry", registry.uri, "--dst", tmp_path / "d")
    one_line_error(r, "points at v2, which is not a committed version")
    r = run_cli("registry", "list", "reach-vla", "--registry", registry.uri)
    assert r.code == 0 and json.loads(r.out)[0]["versions"] == [1]


# ---------------------------------------------------------------- models, tasks, datasets


def test_unknown_tasks_list_the_known_ones():
    for task in ("Roboloop-Nope-v0", "NoSuchEnv-v9"):
        r = run_cli("evaluate", "--task", task, "--policy", "random", "--episodes", "1")
        one_line_error(r, f"unknown task {task!r}", "Roboloop-Reach-Color-v0", "gym_pusht/PushT-v0")


def test_corrupt_model_and_model_env_mismatch_at_evaluate(tiny_model, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_model, bad)
    (bad / "model.safetensors").write_bytes((bad / "model.safetensors").read_bytes()[:64])
    common = ["evaluate", "--task", "gym_pusht/PushT-v0", "--episodes", "1", "--num-envs", "1", "--videos", "0",
              "--output-dir", tmp_path / "eval"]
    one_line_error(run_cli(*common, "--policy", bad), "model.safetensors cannot be read")
    one_line_error(run_cli(*common, "--policy", tiny_model), "outputs 6-dim actions", "takes 2")


def test_cut_video_during_training_names_the_file(v3_dataset, tmp_path):
    ds = tmp_path / "v3"
    shutil.copytree(v3_dataset, ds)
    mp4 = next((ds / "videos").rglob("*.mp4"))
    mp4.write_bytes(mp4.read_bytes()[: mp4.stat().st_size // 3])
    r = run_cli("train", "--dataset", ds, "--output-dir", tmp_path / "run", "--steps", "30", "--max-tokens", "512",
                "--checkpoint-every-steps", "0", "--window", "4")
    one_line_error(r, mp4.name)
    assert "episode" in r.err and "camera observation.images.top" in r.err


def test_a_plain_file_is_not_a_dataset(tmp_path):
    f = tmp_path / "dataset.zip"
    f.write_bytes(b"PK\x03\x04")
    r = run_cli("validate", f)
    assert r.code == 1 and "is a file, not a dataset folder" in r.out
    one_line_error(run_cli("convert", f, tmp_path / "out"), "is not a dataset folder")
    one_line_error(run_cli("train", "--dataset", f, "--output-dir", tmp_path / "run"), "is a file, not a dataset")


# ---------------------------------------------------------------- bad options and references, named at once
@pytest.mark.parametrize("args, needles", [
    (["--episodes", "0"], ["--episodes 0", "greater than or equal to 1"]),
    (["--episodes", "-3", "--num-envs", "0"], ["--episodes -3", "--num-envs 0"]),
])
def test_bad_numbers_are_one_line_naming_the_option(args, needles, tmp_path):
    r = run_cli("evaluate", "--policy", "random", *args, cwd=tmp_path, timeout=60)
    one_line_error(r, *needles)
    assert len([ln for ln in r.err.splitlines() if ln.strip()]) == 1, r.err  # not pydantic's four-line dump


def test_an_unknown_registry_model_fails_before_the_simulator_and_writes_nothing(tmp_path):
    t0 = time.time()
    r = run_cli("evaluate", "--policy", "registry:nonexistent@champion", cwd=tmp_path, timeout=60)
    one_line_error(r, "nonexistent has no champion", str(tmp_path / ".roboloop" / "registry"))
    assert time.time() - t0 < 20  # no simulator start-up first (it took 25 s)
    assert list(tmp_path.iterdir()) == []  # and no ./.roboloop/registry made by reading
