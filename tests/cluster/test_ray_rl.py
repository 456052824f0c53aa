"""`roboloop rl --ray-address` on a Ray cluster of two test hosts: the driver on node-0 (the head), the learner,
rollout and Isaac Lab environment workers spread over node-0 and node-1 (`--placement spread`). The model folder
exists only on node-0's disk: it reaches node-1's workers through Ray's object store. The run updates, checkpoints and
publishes a model on node-0, and its progress says where each worker ran."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.cluster import services
from tests.models import untrained_model

pytestmark = [pytest.mark.slow, pytest.mark.isaac]
PY = sys.executable


@pytest.mark.parametrize("hosts", [["node-0", "node-1"]], indirect=True)
def test_rl_spreads_its_workers_over_two_hosts(hosts, work):
    env = services.ray_env()
    disk0 = work / "node-0"
    disk0.mkdir()
    model = untrained_model(disk0 / "bc", state_dim=18, action_dim=2, horizon=8, state_std=0.3, action_std=0.5)
    services.ray_cluster(hosts, work, env)
    r = hosts.run("node-0", [PY, "-m", "roboloop.cli", "rl", "--policy", str(model), "--output-dir",
                             str(disk0 / "rl"), "--mode", "async", "--env-steps", str(3 * 256), "--env-workers", "2",
                             "--envs-per-worker", "4", "--segment-decisions", "4", "--segments-per-update", "2",
                             "--max-staleness", "1", "--epochs", "1", "--minibatch", "32",
                             "--critic-warmup-updates", "1", "--checkpoint-every", "1", "--x0", "zero",
                             "--placement", "spread", "--ray-address", "node-0:6379"],
                  env=env, cwd=disk0, timeout=900)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    where = next(line for line in r.stderr.splitlines() if "rl: learner on" in line)
    print(where)
    assert "node-0" in where and "node-1" in where, where  # the workers ran on both hosts
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["updates"] >= 2 and result["env_steps"] >= 3 * 256, result
    assert (Path(result["model_dir"]) / "model.safetensors").is_file()
    assert list((disk0 / "rl" / "checkpoints").glob("step-*/meta.json"))


@pytest.mark.parametrize("hosts", [["node-0", "node-1"]], indirect=True)
def test_rl_fails_clearly_when_a_worker_host_is_lost(hosts, work):
    """node-1's cable pulled after RL's second update: the run fails once Ray declares the machine dead (its
    heartbeats missed: here after 5 missed checks 1 s apart, where Ray's defaults took 65 s), naming the worker's
    address and the checkpoint a rerun resumes from."""
    import subprocess
    import time

    env = services.ray_env()
    env = {**env, "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
           "RAY_health_check_failure_threshold": "5"}  # the head's GCS declares a silent node dead after ~5 s
    disk0 = work / "node-0"
    disk0.mkdir()
    model = untrained_model(disk0 / "bc", state_dim=18, action_dim=2, horizon=8, state_std=0.3, action_std=0.5)
    services.ray_cluster(hosts, work, env)
    with open(work / "rl.log", "w") as log:
        p = hosts.popen("node-0", [PY, "-m", "roboloop.cli", "rl", "--policy", str(model), "--output-dir",
                                   str(disk0 / "rl"), "--mode", "async", "--env-steps", str(400 * 256),
                                   "--env-workers", "2", "--envs-per-worker", "4", "--segment-decisions", "4",
                                   "--segments-per-update", "2", "--max-staleness", "1", "--epochs", "1",
                                   "--minibatch", "32", "--critic-warmup-updates", "1", "--checkpoint-every", "1",
                                   "--x0", "zero", "--placement", "spread", "--ray-address", "node-0:6379"],
                        env=env, cwd=disk0, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 600
    while "rl: update 2" not in (work / "rl.log").read_text():
        assert p.poll() is None and time.time() < deadline, (work / "rl.log").read_text()[-3000:]
        time.sleep(0.2)
    hosts.cut("node-1")
    t0 = time.time()
    try:
        code = p.wait(300)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError("RL kept running after its worker's host was lost:\n"
                             + (work / "rl.log").read_text()[-6000:]) from None
    waited = time.time() - t0
    text = (work / "rl.log").read_text()
    error = next(line for line in text.splitlines() if line.startswith("roboloop rl: error:"))
    print(f"exit {code} after {waited:.0f} s: {error}")
    assert code != 0 and waited < 60, (code, waited)
    assert f"RL lost a worker at {hosts.addresses['node-1']}: its machine was lost" in error, error
    assert "rerun to resume from step-" in error, error
    assert list((disk0 / "rl" / "checkpoints").glob("step-*/meta.json"))  # a retry resumes from these
