"""The loop's presets: one source for make demo, CI and the nightly deployment."""

from __future__ import annotations

from pathlib import Path

import yaml

from roboloop.loop import PRESETS, LoopConfig, nightly_gpu

ROOT = Path(__file__).resolve().parents[2]


def _deployment(name: str) -> dict:
    doc = yaml.safe_load((ROOT / "deployments/prefect.yaml").read_text())
    return next(d for d in doc["deployments"] if d["name"] == name)


def test_each_closed_loop_deployment_names_its_preset_and_nothing_else():
    """The form: a preset and the settings people change, empty; the rest (overrides, cfg) collapsed."""
    from roboloop.loop.form import settle

    for name, preset in (("closed-loop", "nightly_gpu"), ("closed-loop-cpu", "demo"),
                         ("closed-loop-cluster", "cluster"), ("closed-loop-so101", "so101")):
        params = _deployment(name)["parameters"]
        assert params == {"preset": preset}, (name, params)
        assert settle(**params) == PRESETS[preset](), name
    assert settle(preset="nightly_gpu") == nightly_gpu()


def test_single_machine_deployment_runs_the_demo_preset_and_its_trigger_only_changes_the_source():
    from roboloop.loop import demo
    from roboloop.loop.form import settle

    d = _deployment("closed-loop-cpu")
    assert d["work_pool"]["name"] == "cpu"
    triggered = d["triggers"][0]["parameters"]
    assert set(triggered) == {"source"}  # merged with the deployment's preset
    ran = settle(**{**d["parameters"], "source": "/data/arrived"}).model_dump(mode="json")
    want = demo().model_dump(mode="json")
    assert {k for k in ran if ran[k] != want[k]} == {"source", "collect_if_missing"}
    assert ran["collect_if_missing"] is None  # a dataset that arrived is never overwritten by a recording


def test_schedules_have_an_explicit_timezone_and_loops_run_one_at_a_time():
    for name in ("closed-loop", "closed-loop-cpu", "closed-loop-cluster"):
        d = _deployment(name)
        assert all(s.get("timezone") == "UTC" for s in d["schedules"]), name
        assert d["concurrency_limit"] == {"limit": 1, "collision_strategy": "CANCEL_NEW"}, name


def test_evaluate_deployment_defaults_are_the_flows():
    from flows.evaluate import EvaluateParams

    assert _deployment("evaluate")["parameters"]["params"] == EvaluateParams().model_dump(mode="json")


def test_presets_are_machine_independent_and_every_field_is_described(tmp_path):
    """A preset is the same JSON on another machine: here, another process with another working directory, other
    roboloop settings in the environment, one CPU (taskset) and no GPU visible."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    code = ("import json; from roboloop.loop import PRESETS; "
            "print(json.dumps({n: p().model_dump(mode='json') for n, p in PRESETS.items()}, sort_keys=True))")
    env = {**os.environ, "ROBOLOOP_ARTIFACTS": str(tmp_path / "a"), "ROBOLOOP_REGISTRY": str(tmp_path / "r"),
           "ROBOLOOP_CACHE_DIR": str(tmp_path / "c"), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", code]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    there = json.loads(subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                                      check=True).stdout)
    here = json.loads(json.dumps({n: p().model_dump(mode="json") for n, p in PRESETS.items()}, sort_keys=True))
    assert set(there) == set(PRESETS)
    for name in PRESETS:
        assert there[name] == here[name], name

    def undocumented(model, prefix=""):
        out = []
        for field, info in model.model_fields.items():
            if not info.description:
                out.append(prefix + field)
            ann = info.annotation
            for sub in getattr(ann, "__args__", (ann,)):
                if isinstance(sub, type) and hasattr(sub, "model_fields") and sub is not model:
                    out += undocumented(sub, f"{prefix}{field}.")
        return out

    assert undocumented(LoopConfig) == []


def test_sweep_deployment_parameters_are_valid():
    from flows.sweep import SweepParams

    params = SweepParams.model_validate(_deployment("checkpoint-sweep")["parameters"]["params"])
    assert params.eval.execute_steps is None  # the model's own execution settings


def test_rl_deployment_parameters_are_valid():
    from flows.rl_finetune import RLParams

    params = RLParams.model_validate(_deployment("rl-finetune")["parameters"]["params"])
    assert params.rl.mode == "async" and params.rl.learner_device == "cuda"
    assert params.rl.learner_gpus == 1.0  # a CUDA learner reserves its GPU from Ray
    assert params.eval.task == params.rl.task


def test_a_users_dataset_runs_the_preset_offline_and_is_only_read(tmp_path, monkeypatch):
    from roboloop.loop import demo, for_source

    monkeypatch.chdir(tmp_path)
    cfg = for_source(demo(), "recordings/My Robot G1/")
    assert cfg.source == str(tmp_path / "recordings/My Robot G1") and cfg.collect_if_missing is None
    assert cfg.evaluation == "offline" and cfg.train.val_fraction == 0.1 and cfg.model_name == "my-robot-g1"
    assert cfg.train.with_video  # the user's cameras are fed (the demo's reach recipe trains without them)
    assert cfg.train.steps == demo().train.steps  # the preset's recipe otherwise
    assert cfg.serve_check is None  # it drives the simulator through the server: offline has none
    s3 = for_source(demo(), "s3://bucket/lab/so101", "simulator", "arm")
    assert (s3.source, s3.evaluation, s3.model_name) == ("s3://bucket/lab/so101", "simulator", "arm")
    assert s3.serve_check == demo().serve_check


def test_the_served_check_is_refused_offline_and_says_what_it_saw():
    import pytest
    from pydantic import ValidationError

    from roboloop.loop import demo
    from roboloop.receipts import Decision
    from roboloop.registry import default_uri
    from roboloop.serving.check import ServedCheck, serve_ref

    with pytest.raises(ValidationError, match="serve_check drives the simulator"):
        LoopConfig.model_validate({**demo().model_dump(), "evaluation": "offline",
                                   "train": {**demo().train.model_dump(), "val_fraction": 0.1}})
    here = Decision(registry=default_uri(), name="reach-vla", version=3)
    assert serve_ref(here) == "registry:reach-vla@3"
    assert serve_ref(here.model_copy(update={"registry": "s3://b/reg"})) == "registry:s3://b/reg#reach-vla@3"
    kw = dict(ref="registry:reach-vla@3", versions={"reach-vla@v3+abcd1234": 40}, episodes=16, successes=15,
              in_process_successes=15, chunks=40, roundtrip_ms_p50=4.6, roundtrip_ms_p99=7.9, infer_ms_p50=3.5,
              eval_run="/runs/e")
    same = ServedCheck(same_outcomes=16, **kw).line()
    assert "15/16 succeeded, every episode ended as in-process" in same and "p50 4.6 ms, p99 7.9 ms" in same
    assert "reach-vla@v3+abcd1234 (40 chunks)" in same
    assert "14 of 16 episodes (the rest differ: see /runs/e)" in ServedCheck(same_outcomes=14, **kw).line()


def test_so101_deployment_runs_the_so101_preset():
    d = _deployment("closed-loop-so101")
    assert d["parameters"] == {"preset": "so101"} and d["work_pool"]["name"] == "cpu"


def test_cluster_deployment_runs_the_cluster_preset_and_its_trigger_passes_only_the_dataset():
    from roboloop.loop import cluster

    d = _deployment("closed-loop-cluster")
    assert d["parameters"] == {"preset": "cluster"} and d["work_pool"]["name"] == "cpu"
    assert cluster().launch.deployment == "train-node/train-node" and cluster().launch.nnodes == 2
    node = _deployment("train-node")
    assert node["work_pool"]["name"] == "gpu" and node["entrypoint"] == "flows/train_node.py:train_node"
    trigger = d["triggers"][0]
    assert trigger["parameters"] == {"source": "{{ event.resource['roboloop.path'] }}"}  # the rest: the deployment's
    assert trigger["match"] == {"prefect.resource.id": "roboloop.location.s3-*"}
