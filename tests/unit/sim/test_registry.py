"""The task registry: what a spec resolves to, what it refuses, and that every built-in task's declaration holds
together (its factory, its config class, the scene factors it names)."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from roboloop.errors import UnknownTaskError
from roboloop.sim.factors import FACTORS
from roboloop.sim.registry import TaskSpec, choices, register, task, tasks


def test_ids_resolve_to_their_task_or_family_and_a_namespace_refuses_strays():
    assert task("Roboloop-SO101-PickCube-v0").hold == "joints" and task("Roboloop-Reach-Color-v0").hold == "zero"
    assert task("Isaac-Cartpole-Direct-v0").env == "roboloop.sim.isaac:make"
    assert task("lerobot:pusht?obs_type=environment_state_agent_pos").options["lerobot_env"] == \
        "pusht?obs_type=environment_state_agent_pos"
    with pytest.raises(UnknownTaskError, match="unknown task 'Roboloop-Reach-Blue-v0': known tasks are Roboloop-"):
        task("Roboloop-Reach-Blue-v0")
    assert task("some_pkg/Thing-v0").backend == "gymnasium"  # gymnasium says whether it knows it


def test_a_task_is_registered_once_and_its_env_takes_only_what_it_accepts():
    spec = tasks()["Roboloop-Reach-Red-v0"]
    assert register(spec) is spec  # the same declaration again (a module imported twice) is fine
    with pytest.raises(ValueError, match="registered twice, differently"):
        register(replace(spec, env="elsewhere:make"))
    with pytest.raises(ValueError, match="Roboloop-Reach-Red-v0 does not take retry_failed"):
        spec.make(1, overrides={"retry_failed": 2})


def test_forms_offer_the_registered_tasks_and_recording_only_those_with_an_expert():
    assert "gym_pusht/PushT-v0" in choices() and "lerobot:pusht" in choices()
    assert "gym_pusht/PushT-v0" not in choices(expert_only=True)
    assert set(choices(expert_only=True)) == {t for t, s in tasks().items() if s.expert}


@pytest.mark.parametrize("task_id", sorted(tasks()))
def test_every_built_in_declaration_holds_together(task_id):
    spec: TaskSpec = tasks()[task_id]
    module, _, name = spec.env.partition(":")
    assert importlib.util.find_spec(module) is not None and name
    assert set(spec.scene_factors) <= {f for f, v in FACTORS.items() if v.acts_on == "scene"}
    for key in ("entry", "cfg"):
        if key in spec.options:
            assert importlib.util.find_spec(spec.options[key].partition(":")[0]) is not None
    if spec.state_names is not None:
        assert len(set(spec.state_names)) == len(spec.state_names)
