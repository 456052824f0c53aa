"""The closed loop under `prefect_test_harness`: end to end on tiny data, cached rerun, bad data stopped."""

from __future__ import annotations

import shutil
import time

import pytest
from prefect.artifacts import Artifact

from flows.closed_loop import ClosedLoopParams, closed_loop
from roboloop.datasets.convert import ConvertConfig
from roboloop.evaluation.run import CollectConfig, EvalConfig
from roboloop.registry import Registry
from roboloop.training.config import TrainConfig

# The harness's server and client leave sockets for the GC to close (ResourceWarning, reported as unraisable).
pytestmark = [pytest.mark.isaac, pytest.mark.slow, pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]


def _params(root) -> ClosedLoopParams:
    return ClosedLoopParams(
        source=str(root / "data"),
        collect_if_missing=CollectConfig(episodes=12, num_envs=12),
        dataset_v3=str(root / "artifacts" / "dataset_v3"),
        convert=ConvertConfig(progress=False),
        train=TrainConfig(dataset="-", output_dir=str(root / "artifacts" / "model"), steps=30,
                          checkpoint_every_steps=10, max_tokens=1024),
        eval=EvalConfig(episodes=6, num_envs=6, videos=1, output_dir=str(root / "artifacts" / "eval")),
        registry=str(root / "registry"),
    )


def test_closed_loop_end_to_end_then_every_stage_cached(dvc_repo):
    params = _params(dvc_repo)
    first = closed_loop(params)
    assert first["registry"]["version"] == 1 and first["registry"]["promoted"]  # first model: champion
    assert 0.0 <= first["success_rate"] <= 1.0 and first["random_success_rate"] is not None
    reg = Registry(params.registry)
    lineage = reg.lineage("reach-vla", "champion")
    assert lineage["dataset_md5"] == first["dataset_md5"] and lineage["model_md5"] == first["model_md5"]
    assert lineage["eval"]["episodes"] == 6 and lineage["git_commit"]
    assert (dvc_repo / "artifacts" / "dataset_v3.dvc").exists() and (dvc_repo / "data.dvc").exists()
    report = Artifact.get("closed-loop-report")
    assert report is not None and "policy success" in str(report.data)

    t0 = time.perf_counter()
    second = closed_loop(params)
    rerun_s = time.perf_counter() - t0
    assert second["model_md5"] == first["model_md5"] and second["success_rate"] == first["success_rate"]
    assert second["registry"]["reused"] and reg.versions("reach-vla") == [1]  # nothing re-registered
    assert rerun_s < 60, f"cached rerun took {rerun_s:.1f} s"

    from roboloop.reproduce import reproduce

    rep = reproduce("reach-vla@1", registry=params.registry, on_line=lambda _line: None)
    # same data md5s, bit-identical weights, same loss and success rate
    assert rep["match"], {k: c for k, c in rep["checks"].items() if not c["match"]}
    assert rep["checks"]["weights_sha256"]["recorded"] is not None


def test_corrupt_dataset_stops_at_validation(dvc_repo, tmp_path_factory):
    from roboloop.datasets.generate import GenSpec, generate_v21
    from roboloop.datasets.validate import DatasetDefectError

    params = _params(dvc_repo).model_copy(update={"collect_if_missing": None})
    src = generate_v21(dvc_repo / "data", GenSpec(num_episodes=3, min_length=10, max_length=12,
                                                 cameras={"observation.images.top": (32, 32)}, seed=1))
    victim = next((src / "videos").rglob("episode_000001.mp4"))
    victim.unlink()
    with pytest.raises(DatasetDefectError, match="episode_000001"):
        closed_loop(params)
    art = Artifact.get("validation-report")
    assert art is not None and "episode 1" in str(art.data)
    assert not (dvc_repo / "artifacts" / "dataset_v3").exists()
    assert Registry(params.registry).models() == []
    shutil.rmtree(src)
