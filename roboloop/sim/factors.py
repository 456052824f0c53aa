"""The perturbation factors, declared once: each with its levels, what it does and what it acts on (the state, the
images, the action, the instruction, or the scene, which only a task's own reset or renderer can apply: the task's
spec lists the scene factors it applies, roboloop.sim.registry). `parse` reads a suite's spec (the only parser of
it), `draw` is every factor's random stream. The wrappers that apply the non-scene factors are
roboloop/evaluation/perturb.py's `Perturbed`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Factor:
    levels: tuple[float, ...]
    what: str
    acts_on: str  # "state", "images", "action", "instruction" or "scene"


FACTORS: dict[str, Factor] = {
    "obs_noise": Factor((0.005, 0.02, 0.05), "Gaussian noise on the observed state (std, the state's units)", "state"),
    "action_noise": Factor((0.05, 0.15, 0.3), "Gaussian noise on the executed action (std, a fraction of each "
                           "action dimension's half range)", "action"),
    "actuator_gain": Factor((0.6, 0.8, 1.25), "the executed action scaled: a weaker (< 1) or stiffer (> 1) "
                            "response to the same command", "action"),
    "frame_drop": Factor((0.1, 0.3, 0.5), "probability at each step that the cameras' frames are the previous "
                         "ones again (a dropped frame)", "images"),
    "frame_delay": Factor((1, 2, 4), "camera frames arrive this many steps late (the state is current)", "images"),
    "camera_shift": Factor((2, 4, 8), "each camera's image moved by this many pixels in a direction drawn per "
                           "episode (a camera translated in its image plane; not re-rendered)", "images"),
    "brightness": Factor((0.6, 0.8, 1.3), "each image's brightness scaled (lighting; not re-rendered)", "images"),
    "instruction": Factor((1, 2), "the instruction reworded, drawn per episode: 1 another verb (touch the red ball), "
                          "2 another verb and noun in a longer sentence (please move over to the red sphere now); "
                          "the words that name the goal (its colour) are kept", "instruction"),
    "object_pose": Factor((0.25, 0.5, 1.0), "the object (the named ball, the cube) placed at a bearing beyond the "
                          "training range, by up to this fraction of the range's half-width (its distance kept)",
                          "scene"),
    "arm_pose": Factor((0.25, 0.5, 1.0), "the arm's start beyond the training range (the reach arm's shoulder, the "
                       "SO-101's arm joints), by up to this fraction of each range's half-width", "scene"),
    "camera_pose": Factor((1, 2, 4), "each camera re-rendered moved by this many cm and turned by this many degrees, "
                          "in directions drawn per episode and camera (in the frame it rides: the world, or the wrist "
                          "camera's link)",
                          "scene"),
    "camera_fov": Factor((0.8, 0.9, 1.1, 1.25), "each camera re-rendered with its focal length scaled by this (its "
                         "field of view narrower above 1)", "scene"),
    "lighting": Factor((0.5, 0.75, 1.5), "the scene re-rendered with its light scaled by this", "scene"),
    "distractors": Factor((1, 2, 3), "this many cubes of other colours (blue, green, yellow) on the table where the "
                          "cube could be, drawn per episode (seen by the cameras, not collidable: Roboloop-SO101-"
                          "PickCube-v0)", "scene"),
    "colour_swap": Factor((60, 120, 180), "the object drawn in another colour: its hue turned by this many degrees, "
                          "one way or the other per episode (the red cube yellow or magenta, green or blue, cyan: "
                          "Roboloop-SO101-PickCube-v0)", "scene"),
}

RENDERED = ("camera_pose", "camera_fov", "lighting")  # the scene factors a task applies through its renderer


def renders(spec: str | None) -> bool:
    """Whether the suites of `spec` name a factor that only an env rendering its cameras can apply (`all` does)."""
    return bool(spec) and any(f in RENDERED for f, _ in parse(str(spec)))


def parse(spec: str, scene_factors: tuple[str, ...] | None = None) -> list[tuple[str, float]]:
    """`all`, or `FACTOR[=LEVEL],...` (a factor without a level: all its levels) -> [(factor, level)]. `all` takes
    the scene factors the task applies (`scene_factors`; None: every one)."""
    out: list[tuple[str, float]] = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        if part == "all":
            out += [(n, lv) for n, f in FACTORS.items() for lv in f.levels
                    if f.acts_on != "scene" or scene_factors is None or n in scene_factors]
            continue
        name, _, level = part.partition("=")
        if name not in FACTORS:
            raise ValueError(f"perturb: unknown factor {name!r}; the factors are {', '.join(FACTORS)} (or all)")
        try:
            levels = [float(level)] if level else list(FACTORS[name].levels)
        except ValueError:
            raise ValueError(f"perturb: {part!r}: the level must be a number (e.g. {name}="
                             f"{FACTORS[name].levels[0]})") from None
        out += [(name, lv) for lv in levels]
    if not out:
        raise ValueError("perturb: no factor given (e.g. obs_noise=0.02,frame_drop or all)")
    return list(dict.fromkeys(out))


def draw(seed: int, factor: str, level: float, episode: int, step: int) -> np.random.Generator:
    """The stream of one (seed, factor, level, episode, step): step -1 is the episode's own draw (a paraphrase, a
    camera direction), -2 its scene's (the task's reset)."""
    key = hashlib.blake2b(f"{seed}/{factor}/{level}/{episode}/{step}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(key, "little"))


