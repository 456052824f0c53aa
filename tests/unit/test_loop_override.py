"""`roboloop loop --preset P --override JSON`: a preset with a few settings changed, no setting silently dropped."""

from __future__ import annotations

import argparse

import pytest

from roboloop.cli.loop import config
from roboloop.loop import so101


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"preset": "demo", "config": None, "override": None, "source": None,
                                 "evaluation": None, "model_name": None, "no_track": False, **kw})


def test_nested_settings_merge_into_the_preset():
    cfg = config(_args(preset="so101", override='{"collect_if_missing": {"environment_state": true}, "train": '
                       '{"aux_target": "observation.environment_state", "model_overrides": {"aux_to_state": 1}}}'))
    want = so101()
    assert cfg.collect_if_missing.environment_state
    assert cfg.collect_if_missing.episodes == want.collect_if_missing.episodes
    assert cfg.train.aux_target == "observation.environment_state" and cfg.train.steps == want.train.steps
    assert cfg.train.model_overrides == {**want.train.model_overrides, "aux_to_state": 1}  # merged, not replaced
    assert config(_args(preset="so101")) == want  # nothing given, nothing changed


@pytest.mark.parametrize(("text", "error"), [
    ('{"train": {"stepz": 5}}', "train.stepz is not a setting"),
    ('{"evl": {"episodes": 5}}', "evl is not a setting"),
    ('{"train": {"steps": "many"}}', "steps"),
    ("[1]", "takes a JSON object"),
    ("{train: 1}", "is not JSON"),
])
def test_a_wrong_override_is_refused_with_its_name(text, error):
    with pytest.raises(ValueError, match=error):
        config(_args(override=text))


def test_a_family_chosen_by_override_drops_the_presets_settings_it_does_not_read(capsys):
    """The demo preset's max_tokens (the VLA's token budget) would do nothing for ACT: set back to its default, and
    said; the same setting named in the override is refused instead."""
    cfg = config(_args(override='{"train": {"policy_type": "act"}}'))
    assert cfg.train.family == "lerobot" and cfg.train.max_tokens == 2048
    assert "train.max_tokens 4096 from the preset does not apply to this family" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_tokens=4096 would do nothing"):
        config(_args(override='{"train": {"policy_type": "act", "max_tokens": 4096}}'))


def test_the_loop_form_settles_a_preset_its_top_level_settings_and_overrides():
    """What the closed-loop deployments' form takes: a preset, the settings people change, the rest as overrides
    or a whole cfg; each setting lands where the loop reads it, and one that would do nothing is refused."""
    from roboloop.loop import demo, so101
    from roboloop.loop.form import settle

    assert settle() == demo()
    s = settle(preset="so101", steps=1000, episodes=4, margin=0.1, overrides={"train": {"lr": 0.002}})
    assert (s.train.steps, s.eval.episodes, s.margin, s.train.lr) == (1000, 4, 0.1, 0.002)
    assert s.model_dump(exclude={"train", "eval", "margin"}) == so101().model_dump(exclude={"train", "eval", "margin"})
    act = settle(policy="act")
    assert act.train.policy_type == "act" and act.train.family == "lerobot"
    assert settle(cfg=act, policy="vla").train.family == "vla"
    arrived = settle(source="/data/arm")
    assert arrived.source == "/data/arm" and arrived.collect_if_missing is None
    with pytest.raises(ValueError, match="preset 'demo' would do nothing: cfg gives the whole config"):
        settle(preset="demo", cfg=demo())
    with pytest.raises(ValueError, match="episodes would do nothing: an offline evaluation"):
        settle(evaluation="offline", episodes=5)
    with pytest.raises(ValueError, match="override: train.stepz is not a setting of the loop"):
        settle(overrides={"train": {"stepz": 5}})
    with pytest.raises(ValueError, match="unknown preset 'nightly'"):
        settle(preset="nightly")
    from typing import get_args

    from roboloop.loop import PRESETS
    from roboloop.loop.form import Preset

    assert set(get_args(Preset)) == set(PRESETS)  # the form's choices are the presets there are
