"""Scene factors: an episode's layout moved beyond the range the task trains on, by the task's own reset (the
object and the arm start where no demonstration started), so the physics, the cameras and the expert all see it.

A level is how far beyond the edge of the training range, as a fraction of that range's half-width: 0.5 on the
reach task's ball bearing (+-90 deg) allows up to 45 deg past it; on its shoulder start (+-0.6 rad), 0.3 rad past it.
Each draw comes from `rng` (the perturbation's stream for the episode: a pure function of seed, factor, level and
episode number), so two models meet the same moved scene on the same episode. Pure torch; no simulator needed.

    reach(factor, level, rng, balls, target, q, min_separation) -> (balls, q)
    so101(factor, level, rng, cube, q, theta_range, joint_ranges) -> (cube, q)
"""

from __future__ import annotations

import math

import numpy as np
import torch

SCENE_FACTORS = ("object_pose", "arm_pose")


def _beyond(rng: np.random.Generator, edge: float, level: float) -> float:
    """A signed value past +-`edge` by up to `level` * `edge` (uniform in magnitude, either side)."""
    return float(rng.choice((-1.0, 1.0)) * edge * (1.0 + level * rng.uniform(0.05, 1.0)))


def reach(factor: str, level: float, rng: np.random.Generator, balls: torch.Tensor, target: int, q: torch.Tensor,
          min_separation: float) -> tuple[torch.Tensor, torch.Tensor]:
    """object_pose: the named ball's bearing beyond +-90 deg (its distance kept, the other balls at least
    `min_separation` away); arm_pose: the shoulder's start beyond +-0.6 rad (the elbow's kept)."""
    balls, q = balls.clone(), q.clone()
    if factor == "arm_pose":
        q[0] = _beyond(rng, 0.6, level)
        return balls, q
    r = float(torch.linalg.norm(balls[target]))
    for _ in range(64):
        th = _beyond(rng, math.pi / 2, level)
        xy = torch.tensor([r * math.cos(th), r * math.sin(th)], dtype=balls.dtype)
        others = torch.cat([balls[:target], balls[target + 1:]])
        if torch.linalg.norm(others - xy, dim=-1).min() >= min_separation:
            balls[target] = xy
            return balls, q
    raise RuntimeError(f"object_pose={level:g}: no bearing past 90 deg keeps the balls {min_separation} m apart")


def so101(factor: str, level: float, rng: np.random.Generator, cube: torch.Tensor, q: torch.Tensor,
          theta_range: tuple[float, float], joint_ranges: torch.Tensor, home: torch.Tensor,
          yaw_range: float) -> tuple[torch.Tensor, torch.Tensor]:
    """object_pose: the cube's bearing beyond the training sector (its distance kept, its yaw drawn around the new
    bearing as the task does); arm_pose: each arm joint's start offset from home beyond its training range (the
    gripper's kept)."""
    cube, q = cube.clone(), q.clone()
    if factor == "arm_pose":
        for j, half in enumerate(joint_ranges.tolist()):
            if half > 0:
                q[j] = home[j] + _beyond(rng, half, level)
        return cube, q
    half = (theta_range[1] - theta_range[0]) / 2
    mid = (theta_range[1] + theta_range[0]) / 2
    r = float(torch.linalg.norm(cube[:2]))
    th = mid + _beyond(rng, half, level)
    yaw = th + rng.uniform(-1.0, 1.0) * yaw_range
    cube[0], cube[1], cube[3] = r * math.cos(th), r * math.sin(th), yaw
    return cube, q
