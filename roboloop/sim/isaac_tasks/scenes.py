"""Scene factors: an episode's layout moved beyond the range the task trains on, by the task's own reset (the
object and the arm start where no demonstration started), so the physics, the cameras and the expert all see it.

A level is how far beyond the edge of the training range, as a fraction of that range's half-width: 0.5 on the
reach task's ball bearing (+-90 deg) allows up to 45 deg past it; on its shoulder start (+-0.6 rad), 0.3 rad past it.
Each draw comes from `rng` (the perturbation's stream for the episode: a pure function of seed, factor, level and
episode number), so two models meet the same moved scene on the same episode. Pure torch; no simulator needed.

    reach(factor, level, rng, balls, target, q, min_separation) -> (balls, q)
    so101(factor, level, rng, cube, q, theta_range, joint_ranges) -> (cube, q)
    so101_layout(split, seed, episode, scene_factor) -> (cube, q)   the SO-101 pick's episode, for either simulator
    so101_dressing(scene_factor, episode, cube) -> (distractors, hue)  what else the SO-101's scene shows (Isaac's)
    to_lerobot(q) / from_lerobot(a)        the SO-101's joint radians <-> LeRobot's units (degrees, gripper 0-100)
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

SCENE_FACTORS = ("object_pose", "arm_pose")  # what a task's own reset lays out (the renderers' factors: mujoco_so101)
DRESSING_FACTORS = ("distractors", "colour_swap")  # what the SO-101 task's reset puts beside an unchanged layout


def layout_generator(split: str, seed: int, layout: int, task: str = "reach") -> torch.Generator:
    """The random stream of one layout of a task's scenes: independent of every other layout, split and seed."""
    digest = hashlib.sha256(f"roboloop-{task}:{split}:{seed}:{layout}".encode()).digest()
    return torch.Generator(device="cpu").manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def _beyond(rng: np.random.Generator, edge: float, level: float) -> float:
    """A signed value past +-`edge` by up to `level` * `edge` (uniform in magnitude, either side)."""
    return float(rng.choice((-1.0, 1.0)) * edge * (1.0 + level * rng.uniform(0.05, 1.0)))


def reach(factor: str, level: float, rng: np.random.Generator, balls: torch.Tensor, target: int, q: torch.Tensor,
          min_separation: float) -> tuple[torch.Tensor, torch.Tensor]:
    """object_pose: the named ball's bearing beyond +-90 deg (its distance kept, the other balls at least
    `min_separation` away); arm_pose: the shoulder's start beyond +-0.6 rad (the elbow's kept)."""
    if factor not in SCENE_FACTORS:
        raise ValueError(f"{factor} is not a layout factor ({', '.join(SCENE_FACTORS)})")
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
    if factor not in SCENE_FACTORS:
        raise ValueError(f"{factor} is not a layout factor ({', '.join(SCENE_FACTORS)})")
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


SO101_REACH_R = (0.17, 0.25)  # the cube's distance from the base (m)
SO101_REACH_THETA = (-0.6, 0.6)  # and bearing (rad) from the arm's forward direction (+x)
SO101_CUBE_YAW = 0.5  # the cube turns +-this (rad) from facing the arm
SO101_CUBE = 0.04  # edge (m), as lerobot-env-so101's block
SO101_START_SPREAD = (0.2, 0.1, 0.1, 0.1, 0.2, 0.0)  # rad: each joint's start is home +- this (the gripper's fixed)


def so101_layout(split: str, seed: int, episode: int, scene_factor: tuple[str, float, int] | None = None,
                 reach_r: tuple[float, float] = SO101_REACH_R, reach_theta: tuple[float, float] = SO101_REACH_THETA,
                 cube_yaw: float = SO101_CUBE_YAW) -> tuple[torch.Tensor, torch.Tensor]:
    """The SO-101 pick's episode `episode`: the cube's (x, y, z, yaw) in the arm's base frame and the arm's start
    joints (radians, the `so101_new_calib` zeros), a pure function of (split, seed, episode) that both simulators lay
    out (Isaac Lab's task and the MuJoCo one of lerobot-env-so101)."""
    from isaaclab_so101.constants import HOME_JOINT_POS, SIM_JOINT_NAMES

    from roboloop.sim.factors import draw

    g = layout_generator(split, seed, episode, "so101")
    u = torch.rand(4, generator=g)
    r = reach_r[0] + u[0] * (reach_r[1] - reach_r[0])
    th = reach_theta[0] + u[1] * (reach_theta[1] - reach_theta[0])
    yaw = th + (2 * u[2] - 1) * cube_yaw
    cube = torch.stack([r * torch.cos(th), r * torch.sin(th), torch.tensor(SO101_CUBE / 2), yaw])
    home = torch.tensor([HOME_JOINT_POS[n] for n in SIM_JOINT_NAMES])
    spread = torch.tensor(SO101_START_SPREAD)
    q = home + (torch.rand(6, generator=g) * 2 - 1) * spread
    if scene_factor is not None and scene_factor[0] in SCENE_FACTORS:  # a suite's layout factor (perturb.Perturbed)
        factor, level, fseed = scene_factor
        cube, q = so101(factor, level, draw(fseed, factor, level, episode, -2), cube, q, reach_theta, spread, home,
                        cube_yaw)
    return cube, q


SO101_DISTRACTOR_GAP = 0.06  # m: centres this far apart: two 4 cm cubes never overlap, whatever their yaws


def so101_dressing(scene_factor: tuple[str, float, int] | None, episode: int, cube: torch.Tensor,
                   reach_r: tuple[float, float] = SO101_REACH_R,
                   reach_theta: tuple[float, float] = SO101_REACH_THETA) -> tuple[torch.Tensor, float]:
    """What the SO-101's episode `episode` shows beside its layout (`cube`, unchanged): (distractors' (x, y, yaw),
    the cube's hue turn in degrees). Nominal and the layout factors: none and 0. distractors=N: N cubes drawn in the
    training range of distances and bearings, each `SO101_DISTRACTOR_GAP` from the cube and from each other;
    colour_swap=D: the cube's hue turned by D degrees, one way or the other. A pure function of (seed, factor,
    level, episode)."""
    if scene_factor is None or scene_factor[0] not in DRESSING_FACTORS:
        return torch.zeros(0, 3), 0.0
    from roboloop.sim.factors import draw

    factor, level, seed = scene_factor
    rng = draw(seed, factor, level, episode, -2)
    if factor == "colour_swap":
        return torch.zeros(0, 3), float(rng.choice((-1.0, 1.0)) * level)
    if level != int(level) or level < 1:
        raise ValueError(f"perturb: distractors={level:g}: the level is how many (1, 2, ...)")
    for _ in range(64):  # a layout that left no room for the last one is drawn again from the first
        placed: list[torch.Tensor] = []
        for _ in range(64 * int(level)):
            r, th = rng.uniform(*reach_r), rng.uniform(*reach_theta)
            xy = torch.tensor([r * math.cos(th), r * math.sin(th)], dtype=cube.dtype)
            if all(float(torch.linalg.norm(xy - c[:2])) >= SO101_DISTRACTOR_GAP for c in (cube, *placed)):
                yaw = th + rng.uniform(-1.0, 1.0) * SO101_CUBE_YAW
                placed.append(torch.cat([xy, torch.tensor([yaw], dtype=cube.dtype)]))
                if len(placed) == int(level):
                    return torch.stack(placed), 0.0
    raise RuntimeError(f"distractors={level:g}: no room for them {SO101_DISTRACTOR_GAP} m from the cube and apart")


def turn_hue(rgb: tuple[float, float, float], degrees: float) -> tuple[float, float, float]:
    """`rgb` (0-1) with its hue turned by `degrees` (saturation and value kept)."""
    import colorsys

    h, s, v = colorsys.rgb_to_hsv(*rgb)
    return colorsys.hsv_to_rgb((h + degrees / 360.0) % 1.0, s, v)


def _jaw_range() -> tuple[float, float]:
    from isaaclab_so101.constants import JOINT_LIMITS_DEG

    lo, hi = JOINT_LIMITS_DEG[-1]
    return float(lo), float(hi)


def to_lerobot(q: torch.Tensor) -> torch.Tensor:
    """SO-101 joint radians (.., 6) -> LeRobot units: degrees, the gripper 0-100 over the jaw's range (the
    `so101_new_calib` zeros, which the Isaac task's USD and lerobot-env-so101's MJCF share)."""
    lo, hi = _jaw_range()
    out = torch.rad2deg(q)
    return torch.cat([out[..., :5], (out[..., 5:] - lo) / (hi - lo) * 100.0], dim=-1)


def from_lerobot(a: torch.Tensor) -> torch.Tensor:
    lo, hi = _jaw_range()
    deg = torch.cat([a[..., :5], lo + a[..., 5:] / 100.0 * (hi - lo)], dim=-1)
    return torch.deg2rad(deg)
