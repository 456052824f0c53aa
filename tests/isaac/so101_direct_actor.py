"""An actor that reaches the SO-101's cube its own way, for tests/isaac/test_so101_task.py: run as
`python -m tests.isaac.so101_direct_actor STEPS` (one simulation per process), it drives 4 envs straight at the
cube (3 cm above it, down as it lines up, no approach waypoint above), closes the jaws there, and records the
DAgger labeller's labels of every state it visits. Prints one JSON line: per frame the grasp point's offset from
the cube (horizontal, vertical; m), the gripper's position and its label (0-100)."""

from __future__ import annotations

import json
import sys


def main(steps: int) -> None:
    import torch

    from roboloop.sim.isaac import IsaacLabEnv
    from roboloop.sim.isaac_tasks.so101 import to_lerobot
    from roboloop.sim.isaac_tasks.so101_expert import grasp_frame

    env = IsaacLabEnv("Roboloop-SO101-PickCube-v0", num_envs=4, camera=False,
                      overrides={"expert_labels_others": True})
    u = env.u
    obs = env.reset()
    bias = torch.zeros(4, 5)
    jaw = torch.full((4,), 70.0)
    frames = []
    for _ in range(steps):
        label = env.expert(obs)
        cube, tip = u.cube_pos(), u.grasp_point()
        xy = torch.linalg.norm(cube[:, :2] - tip[:, :2], dim=-1)
        goal = cube.clone()
        goal[:, 2] += (3.0 * (xy - 0.003)).clamp(0.0, 0.03)
        dq = u.expert._ik_step(goal, grasp_frame(u.cube_pose, u.cfg.grasp_tilt), torch.full((4, 1), 0.01),
                               u.sensors())
        bias = (0.98 * bias + 0.1 * dq).clamp(-0.2, 0.2)
        q = u.joint_pos()
        target = q.clone()
        target[:, :5] = q[:, :5] + dq + bias
        act = to_lerobot(target)
        close = torch.linalg.norm(cube - tip, dim=-1) < u.cfg.grasp_tolerance
        jaw = torch.where(close | (jaw < 70), (jaw - 8).clamp(min=0), jaw)
        act[:, 5] = jaw
        for i in range(4):
            frames.append([float(xy[i]), float(tip[i, 2] - cube[i, 2]), float(obs.state[i, 5]), float(label[i, 5])])
        obs = env.step(act).obs
    env.close()
    print(json.dumps({"frames": frames}))


if __name__ == "__main__":
    main(int(sys.argv[1]))
