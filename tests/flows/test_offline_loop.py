"""The closed loop on recordings with no simulator twin (`evaluation: offline`), on datasets LeRobot's own
writer made: scored on the held-out episodes, registered, and put through the paired offline gate."""

from __future__ import annotations

import pytest
from prefect.artifacts import Artifact

from flows.closed_loop import closed_loop
from roboloop.loop import LoopConfig
from roboloop.registry import Registry
from roboloop.training.config import TrainRecipe

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]


def _cfg(source, steps: int = 6) -> LoopConfig:
    return LoopConfig(source=str(source), evaluation="offline", track=False, model_name="arm",
                      train=TrainRecipe(steps=steps, max_tokens=512, warmup_steps=1, checkpoint_every_steps=0,
                                        val_fraction=0.34, model_overrides={"image_size": [32, 32], "horizon": 4,
                                                                            "dim": 32, "head_dim_model": 32}),
                      margin=1.0)


def test_offline_loop_scores_held_out_episodes_and_gates_paired(dvc_repo, monkeypatch):
    from tests.conformance.cases import lerobot_writer

    for k, sub in (("ROBOLOOP_REGISTRY", "registry"), ("ROBOLOOP_ARTIFACTS", "artifacts"),
                   ("ROBOLOOP_CACHE_DIR", "cache")):
        monkeypatch.setenv(k, str(dvc_repo / sub))
    robot = dvc_repo / "robot"
    lerobot_writer({"observation.images.top": (32, 32)}, {}, ["pick the cube", "place it"], num_episodes=6)(robot)

    first = closed_loop(cfg=_cfg(robot))
    assert first.success_rate is None and first.offline is not None
    # 6 steps of training do not beat predicting the mean action on the held-out frames: registered, not promoted
    base = first.offline.baselines
    assert set(base) == {"mean_action", "previous_action"} and 0.5 < base["mean_action"]["mse_norm"] < 2
    assert not first.decision.promoted and first.decision.reason.startswith("first version vs "), first.decision.reason
    assert "baseline: mean action" in first.markdown()
    Registry(dvc_repo / "registry").promote("arm", 1, force=True)  # a person decides; the paired gate follows
    held_out = first.offline.episodes
    assert len(held_out) == 2 and first.offline.samples > 0 and first.offline.mse_norm > 0
    lin = Registry(dvc_repo / "registry").lineage("arm", 1)
    assert lin["offline_eval"]["episodes"] == held_out and lin["eval"] is None
    assert "held-out episodes" in str(Artifact.get("closed-loop-report").data)
    assert "baseline: mean action" in str(Artifact.get("closed-loop-report").data)
    assert Artifact.get(f"eval-offline-{first.weights_sha256[:12]}") is not None

    second = closed_loop(cfg=_cfg(robot, steps=8))  # same data and split: paired over the same held-out episodes
    assert second.weights_sha256 != first.weights_sha256 and second.decision.version == 2
    assert second.decision.reason.startswith(f"offline, paired over {len(held_out)} held-out episodes"), \
        second.decision.reason

    more = dvc_repo / "robot-v2"  # a new data version: the champion is scored on the challenger's held-out episodes
    lerobot_writer({"observation.images.top": (32, 32)}, {}, ["pick the cube", "place it"], num_episodes=9)(more)
    third = closed_loop(cfg=_cfg(more))
    assert third.decision.reason.startswith("offline, paired over"), third.decision.reason


def _tree(root):
    """Every file and folder below `root` with its mode, size and bytes' hash: 'byte for byte unchanged'."""
    import hashlib

    return sorted((p.relative_to(root).as_posix(), p.stat().st_mode, p.is_file() and p.stat().st_size,
                   p.is_file() and hashlib.sha256(p.read_bytes()).hexdigest()) for p in [root, *root.rglob("*")])


def test_loop_on_a_read_only_source_outside_the_repository_tracks_its_own_copy(dvc_repo, monkeypatch,
                                                                              tmp_path_factory):
    import os
    import stat

    from tests.conformance.cases import lerobot_writer

    for k, sub in (("ROBOLOOP_REGISTRY", "registry"), ("ROBOLOOP_ARTIFACTS", "artifacts"),
                   ("ROBOLOOP_CACHE_DIR", "cache")):
        monkeypatch.setenv(k, str(dvc_repo / sub))
    outside = tmp_path_factory.mktemp("nas") / "my_robot"  # not below the repository
    lerobot_writer({"observation.images.top": (32, 32)}, {}, ["pick the cube"], num_episodes=6)(outside)
    for p in [outside, *outside.rglob("*")]:  # read-only, as a mounted share would be
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before, siblings = _tree(outside), sorted(os.listdir(outside.parent))

    s = closed_loop(cfg=_cfg(outside).model_copy(update={"track": True}))
    assert s.decision.version == 1
    assert _tree(outside) == before and sorted(os.listdir(outside.parent)) == siblings  # no .dvc beside it
    copy = dvc_repo / "artifacts" / "datasets"
    assert s.dataset_v3.startswith(str(copy)) and (copy / f"{s.dataset_v3.split('/')[-1]}.dvc").is_file()
    lin = Registry(dvc_repo / "registry").lineage("arm", 1)
    assert lin["raw"]["path"] == str(outside) and lin["raw"]["tracked"] is False and lin["dataset_md5"] == s.dataset_md5
