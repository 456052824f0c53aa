"""Run by tests/isaac/test_so101_dressing.py in its own process (one Isaac Lab simulation per process): the SO-101
task's first two test episodes nominal, with 3 distractors and with the cube's colour turned 120 degrees. Prints one
JSON line: per setting, the scripted expert's actions over the first steps (it reads the simulator, so equal actions
mean equal physics) and how many pixels of the front camera's first frame are red, blue or green (by hue, saturated
ones only: the table is brown, the arm yellow)."""

from __future__ import annotations

import json

import torch

from roboloop.sim.isaac import IsaacLabEnv


def colours(images: torch.Tensor) -> dict[str, int]:
    """Saturated pixels by hue: red (the cube as made), blue and green (two distractors, or the turned cube)."""
    rgb = images.float() / 255
    top, low = rgb.max(-1).values, rgb.min(-1).values
    sat = (top - low) / top.clamp(min=1e-6)
    r, g, b = rgb.unbind(-1)
    vivid = (sat > 0.45) & (top > 0.2)
    return {"red": int((vivid & (r == top) & (g < 0.75 * r) & (b < 0.75 * r)).sum()),
            "green": int((vivid & (g == top) & (r < 0.75 * g)).sum()),
            "blue": int((vivid & (b == top) & (r < 0.75 * b) & (g < 0.9 * b)).sum())}


def main() -> None:
    env = IsaacLabEnv("Roboloop-SO101-PickCube-v0", num_envs=2)
    out = {"scene_factors": list(env.scene_factors)}
    for name, factor, level in (("nominal", None, 0), ("distractors", "distractors", 3),
                                ("colour_swap", "colour_swap", 120)):
        env.perturb_scene(factor, level, 0)
        obs = env.reset()
        seen = colours(obs.images["observation.images.front"])
        cube, q = env.u.cube_pose.tolist(), env.u.start_q.tolist()
        actions = []
        for _ in range(40):
            a = env.expert(obs)
            actions.append(a.tolist())
            obs = env.step(a).obs
        out[name] = {"pixels": seen, "cube": cube, "start": q, "actions": actions}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
