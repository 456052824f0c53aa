"""An evaluation is cached on what shapes it: the same policy, recipe and code is a verified hit; a changed task
asset (the USD the simulator loads) is a new evaluation, run in the simulator with the new asset."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from roboloop import stages
from roboloop.cache import ReceiptCache
from roboloop.evaluation.config import EvalRecipe

pytestmark = [pytest.mark.isaac, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
ARM = "Isaac/IsaacLab/Robots/Roboloop/ReachArm/reach_arm.usda"


def test_a_changed_asset_invalidates_a_cached_evaluation(tmp_path, monkeypatch):
    shutil.copytree(REPO / "assets", tmp_path / "assets")
    monkeypatch.setenv("ISAACSIM_ASSET_ROOT", str(tmp_path / "assets"))  # the children load this copy
    cache, recipe = ReceiptCache(tmp_path / "receipts"), EvalRecipe(episodes=2, num_envs=2, videos=0)
    run = lambda: stages.evaluate("random", recipe, cache=cache, runs_root=tmp_path / "evals",  # noqa: E731
                                  on_line=lambda _l: None)
    first = run()
    assert run().run_dir == first.run_dir  # unchanged: a (verified) cache hit
    with open(tmp_path / "assets" / ARM, "a") as f:
        f.write("\n# a changed asset\n")
    again = run()
    assert again.run_dir != first.run_dir and len(list((tmp_path / "evals").iterdir())) == 2


def test_an_edited_model_config_is_a_new_evaluation(tmp_path):
    """The same weights acting with other settings (config.json's `inference_steps`, as someone tuning them at
    evaluation edits it) are a new evaluation; a heartbeat written beside them is not."""
    import json
    import subprocess
    import sys

    from tests.models import untrained_model

    task = "Roboloop-Reach-Color-v0"
    dims = subprocess.run([sys.executable, "-c", "from roboloop.sim.isaac_tasks import make_cfg; "
                           f"c = make_cfg({task!r}); s = c.action_space; "
                           "print(int(c.observation_space), s if isinstance(s, int) else s.shape[-1])"],
                          capture_output=True, text=True, timeout=300, check=True).stdout.split()
    model = untrained_model(tmp_path / "m", int(dims[-2]), int(dims[-1]), 8, seed=1)
    cache, recipe = ReceiptCache(tmp_path / "receipts"), EvalRecipe(task=task, episodes=2, num_envs=2, videos=0)
    run = lambda: stages.evaluate(str(model), recipe, cache=cache, runs_root=tmp_path / "evals",  # noqa: E731
                                  on_line=lambda _l: None)
    first = run()
    (model / "heartbeat.json").write_text('{"step": 3}')  # a training run's liveness: not how it acts
    assert run().run_dir == first.run_dir
    conf = json.loads((model / "config.json").read_text())
    conf["model"]["inference_steps"] = 1
    (model / "config.json").write_text(json.dumps(conf))
    again = run()
    assert again.run_dir != first.run_dir and again.policy_id == first.policy_id  # same weights, evaluated anew
