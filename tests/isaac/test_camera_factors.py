"""The camera factors on Isaac Lab's tasks (`--perturb camera_pose=L,camera_fov=L`, isaac_tasks/cameras.py): the
renderer takes each camera moved by L cm and turned by L degrees (the SO-101's wrist camera on its link), or its
focal length scaled by L, and draws another picture; nothing else changes (the scripted expert, which reads the
simulator, acts bit for bit as nominally), and the next nominal episodes are nominal's again, frame for frame."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from roboloop.evaluation.perturb import draw
from roboloop.sim.isaac_tasks.cameras import mount_offset, quat_mul
from tests.isaac.test_reach_task import roboloop

pytestmark = pytest.mark.isaac


def probe(task: str) -> dict:
    script = Path(__file__).with_name("camera_factor_probe.py")
    p = subprocess.run([sys.executable, str(script), task, "20"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def turned(q0: torch.Tensor, q1: torch.Tensor) -> torch.Tensor:
    """The angle (degrees) between orientations, per env."""
    return torch.rad2deg(2 * torch.acos((q0 * q1).sum(-1).abs().clamp(max=1.0)))


@pytest.mark.parametrize("task,cameras", [("Roboloop-SO101-PickCube-v0", ("front", "wrist")),
                                          ("Roboloop-Reach-Red-v0", ("camera",))])
def test_camera_factors_move_and_zoom_every_camera_and_change_nothing_else(task, cameras):
    seen = probe(task)
    assert {"camera_pose", "camera_fov"} <= set(seen["scene_factors"])
    nominal = seen["nominal"]
    for name in ("camera_pose", "camera_fov", "nominal_again"):
        assert seen[name]["actions"] == nominal["actions"], name  # the same physics, bit for bit (2 envs)
    assert set(nominal["cameras"]) == set(cameras)
    for cam in cameras:
        base, moved, zoomed, again = (seen[s]["cameras"][cam] for s in
                                      ("nominal", "camera_pose", "camera_fov", "nominal_again"))
        shift = torch.tensor(moved["pos"]) - torch.tensor(base["pos"])
        assert torch.allclose(shift.norm(dim=-1), torch.tensor(0.04), atol=1e-4), (cam, shift)  # 4 cm ...
        assert torch.allclose(turned(torch.tensor(base["quat"]), torch.tensor(moved["quat"])), torch.tensor(4.0),
                              atol=0.01), cam  # ... and 4 degrees
        assert torch.dot(shift[0], shift[1]) / 0.04 ** 2 < 0.99  # each episode draws its own direction
        assert moved["K"] == base["K"] and all(a != b for a, b in zip(moved["digest"], base["digest"], strict=True))
        k0, k1 = torch.tensor(base["K"]), torch.tensor(zoomed["K"])
        assert torch.allclose(k1[:, 0, 0], 1.25 * k0[:, 0, 0]) and torch.allclose(k1[:, 1, 1], 1.25 * k0[:, 1, 1])
        assert torch.equal(k1[:, :2, 2], k0[:, :2, 2]) and zoomed["pos"] == base["pos"]
        # a narrower view: the coloured objects cover more pixels (SO-101 front 161 -> 250 red; reach 66 -> 103)
        assert sum(zoomed["pixels"].values()) > 1.3 * sum(base["pixels"].values()), (cam, zoomed, base)
        assert again == base, cam  # nominal again: the poses, the intrinsics and the frames


def test_a_mount_offset_is_the_level_in_cm_and_degrees_and_a_pure_function_of_its_draw():
    move, turn = mount_offset(2.0, draw(7, "camera_pose", 2.0, 5, -3))
    again = mount_offset(2.0, draw(7, "camera_pose", 2.0, 5, -3))
    assert torch.equal(move, again[0]) and torch.equal(turn, again[1])
    assert math.isclose(float(move.norm()), 0.02, rel_tol=1e-6)
    ident = torch.tensor([0.0, 0.0, 0.0, 1.0])
    assert math.isclose(float(turned(ident, quat_mul(ident, turn))), 2.0, abs_tol=1e-3)
    z90 = torch.tensor([0.0, 0.0, math.sin(math.pi / 4), math.cos(math.pi / 4)])  # a quarter turn about z, twice
    assert torch.allclose(quat_mul(z90, z90), torch.tensor([0.0, 0.0, 1.0, 0.0]), atol=1e-6)


def test_the_expert_under_camera_factors_through_roboloop_evaluate_does_what_it_does_nominally(tmp_path):
    # the scripted expert reads the simulator, not the cameras: its env renders them here only because the suites
    # move them (it is played without cameras otherwise), and its outcomes are nominal's episode for episode
    r = roboloop("evaluate", "--task", "Roboloop-Reach-Red-v0", "--policy", "expert", "--episodes", "4",
                 "--num-envs", "2", "--output-dir", str(tmp_path), "--perturb", "camera_pose=2,camera_fov=0.9")
    nominal = "".join("01"[e["success"]] for e in sorted(json.loads((tmp_path / "report.json").read_text())
                                                          ["per_episode"], key=lambda e: e["index"]))
    assert nominal.count("1") >= 3, nominal
    for factor, level in (("camera_pose", "2"), ("camera_fov", "0.9")):
        cell = r["perturbations"][factor][level]
        assert cell["outcomes"] == nominal and cell["drop"] == 0 and cell["changed_initial"] == 0, (factor, cell)
