"""The SO-101 pick's dressing factors (`--perturb distractors=N,colour_swap=DEG`): the cameras see what each claims
(blue and green cubes beside the red one; the red cube turned green or blue), and nothing else changes: the layout
is nominal's and the physics bit for bit (the scripted expert, which reads the simulator, acts identically), so
through `roboloop evaluate` its outcomes equal nominal's episode for episode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.isaac.test_reach_task import roboloop

pytestmark = pytest.mark.isaac


def test_distractors_and_a_turned_colour_change_the_pictures_and_nothing_else():
    probe = Path(__file__).with_name("so101_dressing_probe.py")
    p = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    seen = json.loads(p.stdout.strip().splitlines()[-1])
    assert {"distractors", "colour_swap"} <= set(seen["scene_factors"])
    nominal, extra, turned = seen["nominal"], seen["distractors"], seen["colour_swap"]
    for run in (extra, turned):
        assert run["cube"] == nominal["cube"] and run["start"] == nominal["start"]  # the same layout ...
        assert run["actions"] == nominal["actions"]  # ... and the same physics, bit for bit (40 steps, 2 envs)
    red = nominal["pixels"]["red"]  # measured 161 (two cubes, 96x128 front frames)
    assert red > 50 and nominal["pixels"]["blue"] + nominal["pixels"]["green"] < 5, nominal
    assert extra["pixels"]["blue"] > 50 and extra["pixels"]["green"] > 50, extra  # measured 163 and 153
    assert extra["pixels"]["red"] > red // 2, extra  # the cube is still there (a distractor may hide some of it)
    assert turned["pixels"]["red"] < 5, turned  # measured 0: no red cube left ...
    assert turned["pixels"]["blue"] + turned["pixels"]["green"] > red // 2, turned  # ... it is green or blue


def test_the_expert_picks_among_distractors_and_a_recoloured_cube_as_it_does_nominally(tmp_path):
    r = roboloop("evaluate", "--task", "Roboloop-SO101-PickCube-v0", "--policy", "expert", "--episodes", "4",
                 "--num-envs", "4", "--videos", "1", "--output-dir", str(tmp_path),
                 "--perturb", "distractors=3,colour_swap=120")
    nominal = "".join("01"[e["success"]] for e in sorted(json.loads((tmp_path / "report.json").read_text())
                                                          ["per_episode"], key=lambda e: e["index"]))
    assert nominal.count("1") >= 3, nominal
    for factor, level in (("distractors", "3"), ("colour_swap", "120")):
        cell = r["perturbations"][factor][level]
        assert cell["outcomes"] == nominal and cell["drop"] == 0, (factor, cell)
        assert cell["changed_initial"] == 0  # the state the policy starts from is nominal's
