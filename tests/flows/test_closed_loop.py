"""The closed loop under `prefect_test_harness`: end to end on tiny data, verified cache hits, DVC restore,
reproduction, bad data stopped at validation."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from prefect.artifacts import Artifact

from flows.closed_loop import closed_loop
from roboloop.evaluation.config import CollectConfig, EvalRecipe
from roboloop.loop import DaggerConfig, LoopConfig, SelectRecipe
from roboloop.registry import Registry
from roboloop.serving.check import ServeCheckRecipe
from roboloop.training.config import TrainRecipe

# The harness's server and client leave sockets for the GC to close (ResourceWarning, reported as unraisable).
pytestmark = [pytest.mark.isaac, pytest.mark.slow, pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]


@pytest.fixture
def loop_env(dvc_repo, monkeypatch):
    monkeypatch.setenv("ROBOLOOP_REGISTRY", str(dvc_repo / "registry"))
    monkeypatch.setenv("ROBOLOOP_ARTIFACTS", str(dvc_repo / "artifacts"))
    monkeypatch.setenv("ROBOLOOP_CACHE_DIR", str(dvc_repo / ".roboloop" / "cache"))
    monkeypatch.setenv("ROBOLOOP_SERVE_TOKEN_FILE", str(dvc_repo / ".roboloop" / "serve-token"))
    return dvc_repo


@pytest.fixture(scope="module")
def reach_demos(tmp_path_factory) -> Path:
    """What `_cfg`'s `collect_if_missing` records (same task, seed and size: the same bytes), recorded once for
    this module's loops; each copies it to its `data/` (the loop's ingest then finds it there)."""
    from roboloop.evaluation.run import collect_in_subprocess

    dst = tmp_path_factory.mktemp("reach-demos") / "data"
    collect_in_subprocess(CollectConfig(dst=str(dst), episodes=12, num_envs=12), on_line=lambda _: None)
    return dst


def _cfg(root) -> LoopConfig:
    return LoopConfig(source=str(root / "data"), collect_if_missing=CollectConfig(episodes=12, num_envs=12),
                      train=TrainRecipe(steps=30, checkpoint_every_steps=15, max_tokens=1024),
                      eval=EvalRecipe(episodes=6, num_envs=6, videos=1, execute_steps=4))


def test_closed_loop_end_to_end_cached_restored_and_reproduced(loop_env, reach_demos):
    root = loop_env
    cfg = _cfg(root).model_copy(update={"select": SelectRecipe(episodes=4, seed=1)})
    shutil.copytree(reach_demos, root / "data")
    first = closed_loop(cfg=cfg)
    # the pick: the step-15 checkpoint and the final model on 4 validation episodes (seed 1), the better carried on
    (pick,) = first.selections
    assert [(c.step, c.episodes) for c in pick.candidates] == [(15, 4), (30, 4)]
    # the rule: highest success, then the higher Wilson lower bound, then the later step
    want = max(pick.candidates, key=lambda c: (c.success_rate, c.ci_low, c.step))
    assert pick.picked_step == want.step, pick.candidates
    assert first.model == pick.picked_model
    # a first model must beat the random policy on the same episodes to become champion
    assert first.decision.version == 1 and first.decision.reason.startswith("first version "), first.decision.reason
    assert first.random_success_rate is not None and "random baseline" in first.decision.reason
    ev = json.loads((Path(first.eval_run) / "report.json").read_text())
    assert ev["successes"] == round(first.success_rate * ev["episodes"]) and ev["episodes"] == 6
    reg = Registry(root / "registry")
    lineage = reg.lineage("reach-vla", 1)
    assert lineage["baseline_eval"]["policy"] == "random" and lineage["baseline_eval"]["episodes"] == 6
    assert lineage["dataset_md5"] == first.dataset_md5 and lineage["model"]["weights_sha256"] == first.weights_sha256
    assert lineage["eval"]["episodes"] == 6 and lineage["git_commit"] and lineage["raw"]["format"] == "v2.1"
    assert list((root / "artifacts" / "datasets").glob("v3-*.dvc")) and (root / "data.dvc").exists()
    report = Artifact.get("closed-loop-report")
    assert report is not None and "policy success" in str(report.data) and "checkpoint picked" in str(report.data)
    from tasks.common import artifact_key

    trained = str(Artifact.get(artifact_key("train-loss", cfg.train.preset)).data)  # the loss curve and run record
    assert "![training loss](data:image/png;base64," in trained and "| precision | fp32 |" in trained, trained[-2000:]
    assert "| compile.why | auto: " in trained and "| optimizer | AdamW" in trained, trained[-2000:]
    assert lineage["config"]["select"]["picked_step"] == pick.picked_step

    t0 = time.perf_counter()
    second = closed_loop(cfg=cfg)  # every stage: a verified cache hit
    rerun_s = time.perf_counter() - t0
    assert second.weights_sha256 == first.weights_sha256 and second.success_rate == first.success_rate
    assert second.eval_run == first.eval_run  # the same evaluation, not a new one
    assert second.decision.reused and reg.versions("reach-vla") == [1] and second.selections == first.selections
    assert rerun_s < 60, f"cached rerun took {rerun_s:.1f} s"

    shutil.rmtree(root / "artifacts")  # a cache hit must not point at outputs that no longer exist
    third = closed_loop(cfg=cfg)
    assert (third.dataset_md5, third.weights_sha256) == (first.dataset_md5, first.weights_sha256)  # from DVC
    assert third.success_rate == first.success_rate and third.decision.reused
    # the run came back from DVC without its checkpoints/; the exports the pick chose among came back too
    assert [c.model for c in third.selections[0].candidates] == [c.model for c in pick.candidates]
    assert json.loads((root / "artifacts" / "models").joinpath(first.model.split("/")[-1], "config.json")
                      .read_text())["train"]["steps"] == 30

    from roboloop.loop.reproduce import reproduce

    rep = reproduce("reach-vla@1", registry=str(root / "registry"), on_line=lambda _line: None)
    # same data md5s, bit-identical weights, same loss and success rate
    assert rep["match"], {k: c for k, c in rep["checks"].items() if not c["match"]}
    assert rep["checks"]["weights_sha256"]["recorded"] is not None


def test_corrupt_dataset_stops_at_validation(loop_env):
    from roboloop.datasets.generate import GenSpec, generate_v21
    from roboloop.datasets.validate import DatasetDefectError

    root = loop_env
    cfg = _cfg(root).model_copy(update={"collect_if_missing": None})
    src = generate_v21(root / "data", GenSpec(num_episodes=3, min_length=10, max_length=12,
                                              cameras={"observation.images.top": (32, 32)}, seed=1))
    victim = next((src / "videos").rglob("episode_000001.mp4"))
    victim.unlink()
    with pytest.raises(DatasetDefectError, match="episode_000001"):
        closed_loop(cfg=cfg)
    art = Artifact.get("validation-report")
    assert art is not None and "episode 1" in str(art.data)
    assert not (root / "artifacts" / "datasets").exists()
    assert Registry(root / "registry").models() == []
    shutil.rmtree(src)


def test_dagger_and_rl_rounds_version_the_data_continue_the_weights_and_plot_success(loop_env, reach_demos):
    """A DAgger round, then an RL round fine-tuning the DAgger round's model, in one loop; the last version served."""
    from roboloop.rl.config import RLRecipe

    root = loop_env
    shutil.copytree(reach_demos, root / "data")
    rl = RLRecipe(mode="sync", env_steps=2 * 256, env_workers=1, envs_per_worker=8, segment_decisions=4,
                  segments_per_update=2, epochs=1, minibatch=32, critic_warmup_updates=0)
    cfg = _cfg(root).model_copy(update={"rounds": 2, "baseline": False,
                                        "dagger": DaggerConfig(episodes=6, num_envs=6, steps=10, warmup_steps=3),
                                        "serve_check": ServeCheckRecipe(episodes=6), "rl": rl})
    s = closed_loop(cfg=cfg)
    assert [(r.round, r.kind) for r in s.rounds] == [(0, "demonstrations"), (1, "dagger"), (2, "rl")]
    # the last version registered, served by `roboloop serve` (a child process) and driven through it: the same
    # episodes end as they did in-process, answered by that version
    sv = s.served
    assert sv is not None and sv.ref == "registry:reach-vla@3" and sv.episodes == 6, sv
    assert sv.same_outcomes == 6 and sv.successes == sv.in_process_successes, sv.line()
    assert [v.split("+")[0] for v in sv.versions] == ["reach-vla@v3"] and sum(sv.versions.values()) == sv.chunks > 0
    assert sv.roundtrip_ms_p50 is not None and sv.roundtrip_ms_p50 >= (sv.infer_ms_p50 or 0) > 0
    assert "served:" in "\n".join(s.human()) and "every episode ended as in-process" in sv.line()
    served = json.loads((Path(sv.eval_run) / "report.json").read_text())
    assert served["episodes"] == 6 and served["served"]["url"].startswith("ws://127.0.0.1:")
    check = Artifact.get("serve-check")
    assert check is not None and "reach-vla@v3" in str(check.data)
    r0, r1, r2 = s.rounds
    assert r1.episodes == r0.episodes + 6  # the round's 6 labelled rollouts joined the data (failures kept)
    assert r1.dataset_md5 != r0.dataset_md5 and r1.weights_sha256 != r0.weights_sha256
    reg = Registry(root / "registry")
    assert reg.versions("reach-vla") == [1, 2, 3]
    lin = reg.lineage("reach-vla", 2)
    assert lin["parents"] == ["reach-vla@v1"] and lin["config"]["round"] == 1
    assert lin["config"]["train"]["init_from"] == r0.model  # continued from round 0's weights
    assert (lin["config"]["train"]["steps"], lin["config"]["train"]["warmup_steps"]) == (10, 3)  # the round's
    agg = json.loads(next((root / "artifacts" / "datasets").glob("aggregate-*/.roboloop-output.json")).read_text())
    assert agg["merged_from"][0] == lin["raw"]["source"].split("+")[0]  # the version names its sources' md5s
    assert len(agg["merged_from"]) == 2 and lin["raw"]["md5"] != agg["merged_from"][0]
    assert list((root / "artifacts" / "datasets").glob("aggregate-*.dvc"))  # the new version is DVC-tracked
    plot = Artifact.get("dagger-rounds")
    assert plot is not None and "data:image/png;base64" in str(plot.data) and "| 1 |" in str(plot.data)
    _rl_round_is_a_child_of_the_last(root, s, r1, r2, rl)

    # a checkpoint sweep of round 0's run: its kept checkpoints and final model, scored and the best registered
    from flows.sweep import SweepParams, checkpoint_sweep

    sw = checkpoint_sweep(SweepParams(run=r0.model, eval=EvalRecipe(episodes=4, num_envs=4, videos=0)))
    assert [x["step"] for x in sw.scored] == [15, 30]
    assert sw.best_step in (15, 30) and sw.decision is not None
    best_lin = reg.lineage("reach-vla", sw.decision.version)
    assert best_lin["metrics"]["weights_sha256"] and best_lin["eval"]["episodes"] == 4 or sw.decision.reused
    art = Artifact.get("checkpoint-sweep")
    assert art is not None and "data:image/png;base64" in str(art.data) and "**best**" in str(art.data)
    # the run held out no episodes: its checkpoints are ranked by their training loss only
    assert sw.agreement is not None and list(sw.agreement["scores"]) == ["train_loss"]
    assert all(set(x["offline"]) == {"train_loss"} for x in sw.scored)
    assert sw.agreement.get("note") or "Spearman" in str(art.data)


def _rl_round_is_a_child_of_the_last(root: Path, s, parent, r, rl) -> None:
    """The RL round fine-tunes the round before it on the same data and registers the result as its child."""
    assert r.weights_sha256 != parent.weights_sha256 and r.dataset_md5 == parent.dataset_md5
    assert s.model == r.model and s.weights_sha256 == r.weights_sha256  # the summary reports the last round
    assert r.version == 3
    lin = Registry(root / "registry").lineage("reach-vla", 3)
    assert lin["parents"] == ["reach-vla@v2"] and lin["config"]["rl"]["env_steps"] == 2 * 256
    assert lin["config"]["parent_weights"] == parent.weights_sha256 and lin["dataset_md5"] == parent.dataset_md5
    assert json.loads((Path(r.model) / "config.json").read_text())["rl"]["parent"] == parent.model
    assert list((root / "artifacts" / "rl").glob("*/model.dvc"))  # DVC-tracked like every model
    plot = Artifact.get("dagger-rounds")
    assert plot is not None and "| 2 | rl |" in str(plot.data)
    assert "| 2 | rl |" in s.markdown()


def test_an_rl_round_on_another_task_than_the_evaluation_is_refused(tmp_path):
    from roboloop.rl.config import RLRecipe

    rl = RLRecipe(mode="sync", env_steps=2 * 256, env_workers=1, envs_per_worker=8)
    with pytest.raises(ValueError, match="differs from eval.task"):
        LoopConfig.model_validate({**_cfg(tmp_path).model_dump(), "rl": {**rl.model_dump(),
                                                                         "task": "Roboloop-Reach-Color-Vision-v0"}})
