"""Run by tests/isaac/test_camera_factors.py in its own process (one Isaac Lab simulation per process): a task's first
two test episodes nominal, with the cameras moved (camera_pose=4), with their focal lengths scaled (camera_fov=1.25),
and nominal again. Prints one JSON line: per setting and camera, its world pose and intrinsic matrix as the renderer
takes them (per env), its first frame's digest and vivid pixels by hue; and the scripted expert's actions over the
first steps (it reads the simulator, so equal actions mean equal physics)."""

from __future__ import annotations

import hashlib
import json
import sys

from so101_dressing_probe import colours

from roboloop.sim.isaac import IsaacLabEnv

SETTINGS = (("nominal", None, 0), ("camera_pose", "camera_pose", 4), ("camera_fov", "camera_fov", 1.25),
            ("nominal_again", None, 0))


def main(task: str, steps: int) -> None:
    env = IsaacLabEnv(task, num_envs=2)
    out: dict = {"scene_factors": list(env.scene_factors)}
    for name, factor, level in SETTINGS:
        env.perturb_scene(factor, level, 0)
        obs = env.reset()
        cams = {}
        for key, cam in env.u.mounts.cameras.items():
            frames = obs.images["observation.images." + ("top" if key == "camera" else key)]
            cams[key] = {"pos": cam.data.pos_w.torch.tolist(), "quat": cam.data.quat_w_world.torch.tolist(),
                         "K": cam.data.intrinsic_matrices.torch.tolist(), "pixels": colours(frames),
                         "digest": [hashlib.sha256(f.numpy().tobytes()).hexdigest()[:16] for f in frames]}
        actions = []
        for _ in range(steps):
            a = env.expert(obs)
            actions.append(a.tolist())
            obs = env.step(a).obs
        out[name] = {"cameras": cams, "actions": actions}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
