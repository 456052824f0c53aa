"""CollectConfig's checks: a setting that a task cannot honour is refused at once, naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from roboloop.evaluation.config import CollectConfig


def test_recording_asks_what_the_task_declares():
    assert CollectConfig(task="Roboloop-SO101-PickCube-v0", environment_state=True).environment_state
    assert CollectConfig(task="MuJoCo-SO101-PickCube-v0", environment_state=True).environment_state
    with pytest.raises(ValidationError, match="task: lerobot:pusht has no scripted expert"):
        CollectConfig(task="lerobot:pusht")
    with pytest.raises(ValidationError, match="instructions_per_layout: Roboloop-Reach-Red-v0 has 1 instruction"):
        CollectConfig(task="Roboloop-Reach-Red-v0", instructions_per_layout=3)
    assert CollectConfig(task="Roboloop-Reach-Color-v0", instructions_per_layout=3).instructions_per_layout == 3


def test_retry_failed_only_where_a_layout_can_be_replayed_differently():
    assert CollectConfig(task="Roboloop-SO101-PickCube-v0", noise=0.5, retry_failed=2).retry_failed == 2
    with pytest.raises(ValidationError, match="retry_failed: Roboloop-Reach-Color-v0 does not replay layouts"):
        CollectConfig(task="Roboloop-Reach-Color-v0", noise=0.5, retry_failed=1)
    with pytest.raises(ValidationError, match="retry_failed: the clean expert"):
        CollectConfig(task="Roboloop-SO101-PickCube-v0", retry_failed=1)  # noise 0: the same run again
    assert CollectConfig(task="Roboloop-SO101-PickCube-v0", policy="random", retry_failed=1).retry_failed == 1


def test_an_so101_recording_keeps_the_real_arms_features_unless_asked():
    assert CollectConfig(task="Roboloop-SO101-PickCube-v0").environment_state is False
    from roboloop.evaluation.run import task_schema
    from roboloop.sim.tasks.so101_pick import ENV_STATE as SO101_ENV_STATE_NAMES

    # the names the recorder gives the task's privileged observation (cube x, y, z, yaw; grasp point x, y, z)
    assert task_schema("Roboloop-SO101-PickCube-v0")[3] == list(SO101_ENV_STATE_NAMES)
    assert len(SO101_ENV_STATE_NAMES) == 7


def test_a_dagger_round_records_what_the_demonstrations_recorded():
    """Its labels are merged with the demonstrations, which refuses datasets whose features differ."""
    from roboloop.loop import so101, vision
    from roboloop.loop.run import dagger_recipe

    cfg = so101()
    recorded = cfg.model_copy(update={"collect_if_missing": cfg.collect_if_missing.model_copy(
        update={"environment_state": True})})
    assert dagger_recipe(recorded).environment_state and dagger_recipe(recorded).camera
    assert not dagger_recipe(cfg).environment_state
    assert not dagger_recipe(vision()).environment_state  # the -Vision- task records its scene state anyway


def test_a_dagger_round_follows_the_features_of_the_data_it_joins(tmp_path):
    """A source recorded earlier (with --environment-state, or without cameras) is not described by the loop's
    `collect_if_missing`: the round's recording takes what the data has, or the merge would refuse it after the
    whole collection had run."""
    import json

    from roboloop.loop import demo, so101
    from roboloop.loop.run import dagger_recipe
    from roboloop.receipts import DatasetRef

    def source(name: str, features: dict) -> DatasetRef:
        (tmp_path / name / "meta").mkdir(parents=True)
        (tmp_path / name / "meta" / "info.json").write_text(json.dumps({
            "codebase_version": "v2.1", "fps": 30, "total_episodes": 1, "total_frames": 1, "total_tasks": 1,
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet", "features": features}))
        return DatasetRef(path=str(tmp_path / name), md5="0" * 32, format="v2.1", num_episodes=1, num_frames=1,
                          fps=30)

    state = {"observation.state": {"dtype": "float32", "shape": [6]}, "action": {"dtype": "float32", "shape": [6]}}
    frames = {"shape": [96, 128, 3]}
    cfg = so101()
    assert not cfg.collect_if_missing.environment_state and cfg.collect_if_missing.camera
    both = dagger_recipe(cfg, source("recorded", {**state, "observation.images.front": {"dtype": "video", **frames},
                                                  "observation.environment_state": {"dtype": "float32",
                                                                                    "shape": [7]}}))
    assert both.environment_state and both.camera
    with pytest.raises(ValidationError, match="camera: Roboloop-SO101-PickCube-v0's state"):
        dagger_recipe(cfg, source("state-only", state))  # refused before anything is collected
    reach = demo()
    assert not reach.collect_if_missing.camera
    images = dagger_recipe(reach, source("images", {**state, "observation.images.front": {"dtype": "image", **frames}}))
    assert images.camera and not images.environment_state
    assert not dagger_recipe(reach, source("reach-state", state)).camera
    missing = DatasetRef(path=str(tmp_path / "gone"), md5="0" * 32, format="v2.1", num_episodes=1, num_frames=1, fps=30)
    assert dagger_recipe(cfg, missing) == dagger_recipe(cfg)  # no features at hand: what the loop records
