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

    first = closed_loop(_cfg(robot))
    assert first.success_rate is None and first.offline is not None and first.decision.promoted
    held_out = first.offline.episodes
    assert len(held_out) == 2 and first.offline.samples > 0 and first.offline.mse_norm > 0
    lin = Registry(dvc_repo / "registry").lineage("arm", 1)
    assert lin["offline_eval"]["episodes"] == held_out and lin["eval"] is None
    assert "held-out episodes" in str(Artifact.get("closed-loop-report").data)
    assert Artifact.get(f"eval-offline-{first.weights_sha256[:12]}") is not None

    second = closed_loop(_cfg(robot, steps=8))  # same data and split: paired over the same held-out episodes
    assert second.weights_sha256 != first.weights_sha256 and second.decision.version == 2
    assert second.decision.reason.startswith(f"offline, paired over {len(held_out)} held-out episodes"), \
        second.decision.reason

    more = dvc_repo / "robot-v2"  # a new data version: the champion is scored on the challenger's held-out episodes
    lerobot_writer({"observation.images.top": (32, 32)}, {}, ["pick the cube", "place it"], num_episodes=9)(more)
    third = closed_loop(_cfg(more))
    assert third.decision.reason.startswith("offline, paired over"), third.decision.reason
