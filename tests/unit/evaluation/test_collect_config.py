"""CollectConfig's checks: a setting that a task cannot honour is refused at once, naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from roboloop.evaluation.config import CollectConfig


def test_environment_state_only_on_roboloops_own_tasks():
    assert CollectConfig(task="Roboloop-SO101-PickCube-v0", environment_state=True).environment_state
    with pytest.raises(ValidationError, match="environment_state: lerobot:pusht is not a roboloop task"):
        CollectConfig(task="lerobot:pusht", environment_state=True)


def test_an_so101_recording_keeps_the_real_arms_features_unless_asked():
    assert CollectConfig(task="Roboloop-SO101-PickCube-v0").environment_state is False
    from roboloop.evaluation.run import SO101_ENV_STATE_NAMES, task_schema

    # the names the recorder gives the task's privileged observation (cube x, y, z, yaw; grasp point x, y, z)
    assert task_schema("Roboloop-SO101-PickCube-v0")[3] == SO101_ENV_STATE_NAMES and len(SO101_ENV_STATE_NAMES) == 7


def test_a_dagger_round_records_what_the_demonstrations_recorded():
    """Its labels are merged with the demonstrations, which refuses datasets whose features differ."""
    from roboloop.loop import so101, vision
    from roboloop.loop_run import dagger_recipe

    cfg = so101()
    recorded = cfg.model_copy(update={"collect_if_missing": cfg.collect_if_missing.model_copy(
        update={"environment_state": True})})
    assert dagger_recipe(recorded).environment_state and dagger_recipe(recorded).camera
    assert not dagger_recipe(cfg).environment_state
    assert not dagger_recipe(vision()).environment_state  # the -Vision- task records its scene state anyway
