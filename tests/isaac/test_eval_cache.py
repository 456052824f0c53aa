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
