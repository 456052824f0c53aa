"""Early stopping against the champion on the real reach task: the evaluation ends at the first look where
the paired decision is certain, and the summary says so."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.isaac


def test_evaluation_stops_once_the_paired_decision_is_certain(tmp_path, monkeypatch):
    from roboloop import stages
    from roboloop.evaluation.config import EvalRecipe
    from roboloop.lineage import eval_record
    from roboloop.registry import Registry

    monkeypatch.setenv("ROBOLOOP_ARTIFACTS", str(tmp_path / "artifacts"))
    reg = Registry(tmp_path / "registry")
    weak = tmp_path / "weak"
    weak.mkdir()
    (weak / "model.safetensors").write_bytes(b"weights")
    (weak / "config.json").write_text(json.dumps({}))
    # a champion that failed the first 48 test-split episodes of this task, seed and execution
    lineage = {"git_commit": "abc", "dataset_md5": "x.dir", "config": {"a": 1}, "metrics": {"final_loss": 1.0},
               "eval": {"task": "Roboloop-Reach-Color-v0", "seed": 0, "execute_steps": 4, "episodes": 48,
                        "successes": 0, "outcomes": "0" * 48}}
    reg.promote("reach", reg.register("reach", weak, lineage), force=True)  # 0/48 beats no baseline: set by hand
    recipe = EvalRecipe(episodes=48, num_envs=16, execute_steps=4, videos=0, early_stop=True)
    s = stages.evaluate("expert", recipe, against="reach", registry=str(reg.uri), on_line=lambda _l: None)
    assert s.episodes == 16 and s.planned_episodes == 48 and s.successes == 16, s
    assert s.stopped_early and s.stopped_early.startswith("stopped after 16 of 48 episodes"), s.stopped_early
    assert s.outcomes == "1" * 16
    # three planned tests (episodes 16, 32 and the gate's on all 48), each at alpha / 3: the gate spends the same
    assert s.looks == 3 and eval_record(s)["looks"] == 3
    # without a comparable champion (another seed) it runs them all
    full = stages.evaluate("expert", recipe.model_copy(update={"seed": 1}), against="reach", registry=str(reg.uri),
                           on_line=lambda _l: None)
    assert full.episodes == 48 and full.stopped_early is None and full.looks is None
