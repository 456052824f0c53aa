"""A task of one's own, added by docs/guides/add-a-task.md's steps alone: its module and its commands are taken from
the page as written, run in an empty folder, and the task does what a robot team relies on: the expert succeeds,
random actions do not, a model trained on the expert's demonstrations succeeds on episodes it never saw, and the
perturbation suites run on it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "guides" / "add-a-task.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", GUIDE.read_text(), flags=re.S | re.M)


def _report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


@pytest.mark.slow
def test_a_task_added_by_the_guide_is_evaluated_recorded_and_learned(tmp_path):
    module, = _blocks("python")
    script, = _blocks("bash")
    (tmp_path / "toy_tasks.py").write_text(module)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("ROBOLOOP_TASK_MODULES", None)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    expert, random = _report(tmp_path / "runs/expert"), _report(tmp_path / "runs/random")
    model = _report(tmp_path / "runs/model")
    assert (expert["task"], expert["backend"], expert["episodes"]) == ("Toy-Point-v0", "python", 20)
    assert expert["success_rate"] == 1.0 and random["success_rate"] <= 0.1
    assert model["success_rate"] >= 0.9, model["success_rate"]
    worst = {f: min(v["success_rate"] for v in levels.values()) for f, levels in model["perturbations"].items()}
    assert set(worst) == {"obs_noise", "action_noise"} and all(r >= 0.5 for r in worst.values()), worst
    info = json.loads((tmp_path / "demos/meta/info.json").read_text())
    assert info["features"]["observation.state"]["names"] == ["x", "y", "goal_x", "goal_y"]  # the spec's names
    assert info["features"]["action"]["names"] == ["dx", "dy"]


def test_a_scene_factor_the_task_does_not_declare_is_refused_before_any_episode(tmp_path):
    module, = _blocks("python")
    (tmp_path / "toy_tasks.py").write_text(module)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "ROBOLOOP_TASK_MODULES": "toy_tasks"}
    done = subprocess.run([sys.executable, "-m", "roboloop.cli", "evaluate", "--task", "Toy-Point-v0", "--policy",
                           "random", "--perturb", "object_pose", "--output-dir", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "perturb: object_pose is applied by the task's own reset or renderer; Toy-Point-v0 applies none" \
        in done.stderr and "Roboloop-SO101-PickCube-v0" in done.stderr
    assert not (tmp_path / "out" / "report.json").exists() and "[progress]" not in done.stderr + done.stdout
