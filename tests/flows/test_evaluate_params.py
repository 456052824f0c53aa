"""The `evaluate` deployment's form: a setting that would do nothing in this flow is refused with the reason (its
Early Stop field did nothing: the flow never passed the champion it compares with)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flows.evaluate import EvaluateParams


def test_early_stop_needs_a_champion_to_stop_against():
    with pytest.raises(ValidationError, match="early_stop would do nothing.*set against"):
        EvaluateParams.model_validate({"eval": {"early_stop": True}})
    with pytest.raises(ValidationError, match="against would do nothing.*set eval.early_stop"):
        EvaluateParams.model_validate({"against": "reach-vla"})
    ok = EvaluateParams.model_validate({"eval": {"early_stop": True}, "against": "reach-vla", "margin": 0.1})
    assert (ok.against, ok.margin, ok.eval.early_stop) == ("reach-vla", 0.1, True)


def test_gate_settings_are_refused_where_nothing_is_promoted():
    with pytest.raises(ValidationError, match="gate_robustness/gate_latency would do nothing"):
        EvaluateParams.model_validate({"eval": {"perturb": "obs_noise", "gate_robustness": 0.1}})
    with pytest.raises(ValidationError, match="gate_robustness/gate_latency would do nothing"):
        EvaluateParams.model_validate({"eval": {"latency": "measured", "gate_latency": True}})
