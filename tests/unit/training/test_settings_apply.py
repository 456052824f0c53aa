"""Refuse, never ignore: every field of TrainRecipe, for each built-in family and with or without cameras, either
belongs to the cache key and changes it (it shapes what trains), is operational (NOT_KEYED: how fast, how often),
or is one nothing reads, which is refused when given another value than its default and left out of the key."""

from __future__ import annotations

import typing

import pytest
from pydantic import ValidationError

from roboloop.keys import keyed
from roboloop.policies import unread_settings
from roboloop.training.config import TrainRecipe

BASES = {
    "vla, video": {},
    "vla, no video": {"with_video": False},
    "vla, aux": {"aux_target": "observation.environment_state"},
    "lerobot act": {"policy_type": "act"},
    "lerobot diffusion": {"policy_type": "diffusion"},
}
# another valid value where the generic rule below would not give one (or one that fits the base)
OTHER = {"policy_config": {"dim_model": 64}, "aux_target": "observation.environment_state", "init_from": "m",
         "device": "cpu", "policy_type": None, "family": None, "lora_alpha": 32, "lora_targets": r".*\.q_proj"}
DEFINING = {"family", "policy_type"}  # they choose the family: walked as the bases


def _other(name: str, value: typing.Any, base: dict) -> typing.Any:
    if name == "model_overrides":
        return {"horizon": 10} if base.get("policy_type") == "act" else {"dim": 64}
    if name in OTHER:
        return OTHER[name]
    ann = TrainRecipe.model_fields[name].annotation
    if typing.get_origin(ann) is typing.Literal:
        return next(c for c in typing.get_args(ann) if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1 if isinstance(value, int) else value * 0.5 + 0.25
    raise AssertionError(f"no other value for {name}={value!r}: add one to OTHER")


@pytest.mark.parametrize("base", BASES)
def test_every_field_changes_the_key_is_operational_or_is_refused(base):
    recipe = TrainRecipe(**BASES[base])
    unread = unread_settings(recipe)
    key = keyed(recipe)
    assert not set(unread) & set(key)  # the key holds only what applies
    walked = {"applies": 0, "operational": 0, "refused": 0}
    for name in TrainRecipe.model_fields:
        if name in DEFINING or name in BASES[base]:
            continue
        other = _other(name, getattr(recipe, name), BASES[base])
        if name in unread:
            with pytest.raises(ValidationError, match=f"{name}=.* would do nothing"):
                TrainRecipe(**{**BASES[base], name: other})
            walked["refused"] += 1
            continue
        try:
            changed = TrainRecipe(**{**BASES[base], name: other})
        except ValidationError as e:  # the change makes another given setting one nothing reads (aux, no video)
            assert "would do nothing" in str(e) and name not in str(e).split("would do nothing")[0], e
            walked["refused"] += 1
            continue
        if name in TrainRecipe.NOT_KEYED:
            assert keyed(changed) == key, name
            walked["operational"] += 1
        else:
            assert keyed(changed) != key, f"{name} is keyed but changing it does not change the key"
            walked["applies"] += 1
    assert walked["refused"] >= (2 if base.startswith("vla") else 5) and walked["applies"] >= 15, walked


def test_what_lerobot_does_not_read_is_refused_by_name_and_reason():
    with pytest.raises(ValidationError, match=r"max_tokens=4096 would do nothing: LeRobot's policies pack no "
                                              r"backbone tokens.*default, 2048"):
        TrainRecipe(policy_type="act", max_tokens=4096)
    with pytest.raises(ValidationError, match=r"model_overrides=.*reads only model_overrides.horizon.*dim"):
        TrainRecipe(policy_type="act", model_overrides={"horizon": 10, "dim": 64})
    with pytest.raises(ValidationError, match="horizon: LeRobot's options belong in policy_config"):
        TrainRecipe(policy_type="diffusion", model_overrides={"horizon": 10})
    with pytest.raises(ValidationError, match="aux_target=.* this recipe feeds no images"):
        TrainRecipe(with_video=False, aux_target="observation.environment_state")
    assert TrainRecipe(policy_type="act", model_overrides={"horizon": 10}).model_overrides == {"horizon": 10}


@pytest.mark.parametrize("given, why, runs", [
    ({"dagger": {"episodes": 8}}, "dagger is set but would do nothing: rounds is 1", {"rounds": 2}),
    ({"offline": {"stride": 2}}, "offline is set but would do nothing: evaluation is 'simulator'",
     {"evaluation": "offline", "train": {"val_fraction": 0.1}}),
    ({"baseline": False, "baseline_episodes": 8}, "baseline_episodes is set but would do nothing: baseline is off",
     {"baseline": True}),
])
def test_loop_settings_of_a_part_that_does_not_run_are_refused(given, why, runs):
    from roboloop.loop import LoopConfig

    with pytest.raises(ValidationError, match=why):
        LoopConfig(**given)
    LoopConfig(**{**given, **runs})  # where that part runs, the same setting is taken
