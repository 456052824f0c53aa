"""A real Prefect server and process workers: deploy prefect.yaml, run `evaluate` with parameters,
see the cron schedule produce runs, and cancel a training run without leaving a rank behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.deploy.conftest import AUTH, api_call

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
pytestmark = [pytest.mark.slow, pytest.mark.isaac]


def _deployment(api: str, name: str) -> dict:
    r = httpx.get(f"{api}/deployments/name/{name}", auth=AUTH, timeout=10)
    r.raise_for_status()
    return r.json()


def _run(api: str, name: str, parameters: dict) -> str:
    dep = _deployment(api, name)
    r = api_call("POST", f"{api}/deployments/{dep['id']}/create_flow_run", json={"parameters": parameters})
    assert r.status_code in (200, 201), r.text
    return r.json()["id"]


def _state(api: str, run_id: str) -> str:
    return api_call("GET", f"{api}/flow_runs/{run_id}").json()["state"]["type"]


def _wait(api: str, run_id: str, states: set[str], timeout: float) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = _state(api, run_id)
        if s in states:
            return s
        time.sleep(1)
    raise AssertionError(f"flow run {run_id} still {_state(api, run_id)} after {timeout} s")


def test_deployments_registered_with_pools_and_cron(stack):
    """Pools and cron as prefect.yaml says; the server turned the nightly cron into runs at 02:00 UTC (the
    stack then paused every schedule, so none of them starts during the tests)."""
    api = stack["api"]
    names = {"closed-loop/closed-loop": "gpu", "evaluate/evaluate": "cpu", "ingest/ingest": "cpu",
             "convert/convert": "cpu", "train/train": "gpu"}
    for name, pool in names.items():
        assert _deployment(api, name)["work_pool_name"] == pool
    registered = stack["registered"]
    nightly = registered["closed-loop"]["schedules"][0]
    assert nightly["schedule"]["cron"] == "0 2 * * *" and nightly["active"] is True
    assert registered["closed-loop-cpu"]["schedules"][0]["active"] is False
    assert stack["scheduled"], "the cron schedule produced no scheduled runs"
    assert all(run["expected_start_time"].endswith(("02:00:00Z", "02:00:00+00:00")) for run in stack["scheduled"])
    now = _deployment(api, "closed-loop/closed-loop")
    assert [s["active"] for s in now["schedules"]] == [False]


def _summaries(tmp: Path, policy: str) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((tmp / "artifacts" / "evals").glob("*/summary.json"),
                                                      key=lambda p: p.stat().st_mtime)]
    return [s for s in found if s["policy"] == policy]


def _completed(stack, name: str, parameters: dict, pool: str = "cpu", timeout: float = 600) -> dict:
    """The finished run as the API gives it (its name, its state and the state's message)."""
    run = _run(stack["api"], name, parameters)
    assert _wait(stack["api"], run, {"COMPLETED", "FAILED", "CRASHED"}, timeout) == "COMPLETED", \
        (stack["tmp"] / f"worker-{pool}.log").read_text()[-4000:]
    return api_call("GET", f"{stack['api']}/flow_runs/{run}").json()


def _reach_models(tmp: Path, registry: Path) -> list[str]:
    """Two tiny reach-task models registered as reach-vla v1 (champion) and v2; returns their weights sha256."""
    from roboloop import stages
    from roboloop.datasets.config import ConvertConfig
    from roboloop.evaluation.config import CollectConfig
    from roboloop.evaluation.run import collect_in_subprocess
    from roboloop.lineage import Lineage
    from roboloop.registry import Registry
    from roboloop.training.config import LaunchConfig, TrainRecipe

    collect_in_subprocess(CollectConfig(dst=str(tmp / "reach"), episodes=8, num_envs=8), on_line=lambda _: None)
    raw = stages.dataset_ref(tmp / "reach")
    data = stages.convert(raw, ConvertConfig(progress=False), dst=tmp / "reach_v3")
    reg, shas = Registry(registry), []
    for seed in (0, 1):
        model = stages.train(data, TrainRecipe(steps=5, seed=seed, max_tokens=512, checkpoint_every_steps=0),
                             LaunchConfig(), output_dir=tmp / f"reach_model_{seed}", on_line=lambda _: None)
        lin = Lineage(dataset_md5=data.md5, config={"train": model.config}, model=model,
                      metrics={**model.metrics, "weights_sha256": model.weights_sha256},
                      eval={"successes": 1, "episodes": 10})
        v = reg.register("reach-vla", model.path, lin.model_dump(mode="json"))
        if seed == 0:
            reg.promote("reach-vla", v, force=True)  # the test sets a champion (1/10 beats no baseline)
        shas.append(model.weights_sha256)
    return shas


def test_evaluate_deployment_defaults_with_champion_and_version_then_a_new_champion(stack):
    from roboloop.registry import Registry

    tmp = stack["tmp"]
    v1, v2 = _reach_models(tmp, tmp / "registry")
    # the deployment's own defaults (registry:reach-vla@champion, its task and settings), as the UI's form sends
    # them, but 8 of its 50 episodes: a whole default evaluation would add 4 minutes and test nothing more
    defaults = _deployment(stack["api"], "evaluate/evaluate")["parameters"]["params"]
    assert defaults["policy"] == "registry:reach-vla@champion" and defaults["eval"]["episodes"] == 50
    shorter = {"params": {**defaults, "eval": {**defaults["eval"], "episodes": 8, "num_envs": 8}}}
    run = _completed(stack, "evaluate/evaluate", shorter)
    champion = _summaries(tmp, "reach-vla@1")  # the alias resolved: the version is what the run reports
    assert champion and champion[-1]["policy_id"] == v1 and champion[-1]["episodes"] == 8
    # the runs list tells runs apart (version and seed in the name) and shows the result (the state's message)
    s = champion[-1]
    assert run["name"] == "evaluate reach-vla@1 on Roboloop-Reach-Color-v0 seed 0", run["name"]
    assert run["state"]["message"].startswith(f"reach-vla@1: {s['successes']}/8 = {s['success_rate']:.1%} ["), run
    Registry(tmp / "registry").promote("reach-vla", 2, force=True)  # a new champion: not the cached old one
    _completed(stack, "evaluate/evaluate", {"params": {"policy": "registry:reach-vla@champion",
                                                       "eval": {"episodes": 4, "num_envs": 4, "videos": 0}}})
    assert _summaries(tmp, "reach-vla@2")[-1]["policy_id"] == v2
    # @2 names the same weights as @champion now: the same recipe is a (verified) cache hit, no new run
    before = len(list((tmp / "artifacts" / "evals").glob("*/summary.json")))
    _completed(stack, "evaluate/evaluate", {"params": {"policy": "registry:reach-vla@2",
                                                       "eval": {"episodes": 4, "num_envs": 4, "videos": 0}}})
    assert len(list((tmp / "artifacts" / "evals").glob("*/summary.json"))) == before


def test_cancelling_training_leaves_no_rank_behind(stack):
    from roboloop.datasets.convert import ConvertConfig, convert
    from roboloop.datasets.generate import GenSpec, generate_v21

    tmp = stack["tmp"]
    src = generate_v21(tmp / "v21", GenSpec(num_episodes=3, min_length=16, max_length=20,
                                            cameras={"observation.images.top": (32, 32)}, seed=3))
    v3 = convert(src, tmp / "v3", ConvertConfig(progress=False))
    out = tmp / "artifacts" / "models"
    params = {"params": {"dataset": str(v3), "train": {"steps": 1_000_000, "device": "cpu", "checkpoint_every_steps": 0,
                                                       "model_overrides": {"image_size": [32, 32]}},
                         "launch": {"nproc_per_node": 2}, "track": False}}
    run = _run(stack["api"], "train/train", params)
    _wait(stack["api"], run, {"RUNNING"}, 300)
    deadline = time.time() + 300
    while time.time() < deadline and len(_ranks(out)) < 3:  # torchrun + 2 ranks
        time.sleep(1)
    assert len(_ranks(out)) >= 3, (tmp / "worker-gpu.log").read_text()[-4000:]
    r = api_call("POST", f"{stack['api']}/flow_runs/{run}/set_state",
              json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True})
    assert r.status_code in (200, 201), r.text
    # Prefect 3.8.8's process worker reports the run Cancelled when its control channel acknowledged the
    # intent and Crashed ("aborted by a termination signal") otherwise; either way it must end, ranks dead.
    final = _wait(stack["api"], run, {"CANCELLED", "FAILED", "CRASHED"}, 180)
    assert final in ("CANCELLED", "CRASHED"), (tmp / "worker-gpu.log").read_text()[-6000:]
    deadline = time.time() + 30
    while time.time() < deadline and _ranks(out):
        time.sleep(0.5)
    assert _ranks(out) == []


def _ranks(out: Path) -> list[str]:
    marker = str(out)
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmd:
                found.append(cmd)
    return found


def test_unauthenticated_api_calls_are_refused(stack):
    api = stack["api"]
    assert httpx.post(f"{api}/deployments/filter", json={}, timeout=10).status_code == 401
    assert httpx.post(f"{api}/deployments/filter", json={}, auth=("roboloop", "wrong"), timeout=10).status_code == 401
    assert httpx.post(f"{api}/deployments/filter", json={}, auth=AUTH, timeout=10).status_code == 200
    # the secret never reaches a log line
    assert AUTH[1] not in (stack["tmp"] / "server.log").read_text() + (stack["tmp"] / "worker-cpu.log").read_text()


def _runs_of(api: str, deployment: str) -> list[dict]:
    dep = _deployment(api, deployment)
    r = httpx.post(f"{api}/flow_runs/filter", json={"deployments": {"id": {"any_": [dep["id"]]}}}, auth=AUTH,
                   timeout=30)
    r.raise_for_status()
    return r.json()


def test_registering_a_version_starts_its_evaluation_and_a_promotion_posts_a_report(stack):
    """The events the register task emits (tasks/events.py), against the automations `make deploy` created."""
    from roboloop.registry import Registry

    api, tmp = stack["api"], stack["tmp"]
    reg, model = Registry(tmp / "events-registry"), tmp / "events-model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "config.json").write_text("{}")
    lineage = {"git_commit": "abc", "dataset_md5": "x.dir", "config": {"a": 1}, "metrics": {"final_loss": 1.0},
               "eval": {"task": "Roboloop-Reach-Color-v0", "episodes": 10, "successes": 9}}
    v = reg.register("reach-vla", model, lineage)
    reg.promote("reach-vla", v, force=True)
    ref = f"registry:{reg.uri}#reach-vla@{v}"
    code = ("from roboloop.receipts import Decision\nfrom tasks.events import model_events\n"
            f"print(model_events(Decision(registry={reg.uri!r}, name='reach-vla', version={v}, "
            f"promoted=True, reason='paired: not worse', champion={v}), 'sha'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=stack["env"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "roboloop.model.registered" in out.stdout, out.stderr[-3000:]
    deadline, evals, reports = time.time() + 120, [], []
    while time.time() < deadline and not (evals and reports):
        evals = [r for r in _runs_of(api, "evaluate/evaluate") if r["parameters"]["params"]["policy"] == ref]
        reports = [r for r in _runs_of(api, "promotion-report/promotion-report")
                   if r["parameters"]["params"]["ref"] == ref]
        time.sleep(2)
    assert evals and reports, "the automations started no run"
    assert _wait(api, reports[0]["id"], {"COMPLETED", "FAILED", "CRASHED"}, 300) == "COMPLETED", \
        (tmp / "worker-cpu.log").read_text()[-4000:]
    art = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"key": {"any_": ["promotion-reach-vla"]}}},
                     auth=AUTH, timeout=30).json()
    assert art and f"Promotion of `reach-vla` v{v}" in art[0]["data"] and "9/10" in art[0]["data"]
    # a whole 50-episode evaluation is not needed to show it started: cancel it
    httpx.post(f"{api}/flow_runs/{evals[0]['id']}/set_state", auth=AUTH, timeout=30,
               json={"state": {"type": "CANCELLING"}, "force": True})


def test_a_dataset_arriving_in_the_watched_location_starts_the_closed_loop_on_it(stack):
    """watch-datasets (run as its deployment) sees a new dataset folder and emits `roboloop.dataset.arrived`;
    the closed-loop-cpu automation starts the loop with that folder as its source (cancelled once started:
    the loop itself is tested elsewhere)."""
    from roboloop.datasets.generate import GenSpec, generate_v21

    api, tmp = stack["api"], stack["tmp"]
    inbox = tmp / "incoming"
    inbox.mkdir()
    arrived = generate_v21(inbox / "arm-2026-11-23", GenSpec(num_episodes=2, min_length=8, max_length=10, seed=1))
    _completed(stack, "watch-datasets/watch-datasets", {"params": {"location": str(inbox)}})
    deadline, loops = time.time() + 120, []
    while time.time() < deadline and not loops:
        loops = [r for r in _runs_of(api, "closed-loop/closed-loop-cpu")
                 if r["parameters"].get("source") == str(arrived.absolute())]
        time.sleep(2)
    assert loops, "no closed-loop-cpu run for the dataset that arrived"
    from roboloop.loop.form import settle

    params = loops[0]["parameters"]
    assert params == {"preset": "demo", "source": str(arrived.absolute())}, params  # the deployment's preset
    cfg = settle(**params)
    assert cfg.collect_if_missing is None and cfg.train.steps == 1200  # the demo recipe, on that data
    httpx.post(f"{api}/flow_runs/{loops[0]['id']}/set_state", auth=AUTH, timeout=30,
               json={"state": {"type": "CANCELLING"}, "force": True})
    _completed(stack, "watch-datasets/watch-datasets", {"params": {"location": str(inbox)}})  # seen: no new run
    time.sleep(5)
    assert len([r for r in _runs_of(api, "closed-loop/closed-loop-cpu")
                if r["parameters"].get("source") == str(arrived.absolute())]) == 1
