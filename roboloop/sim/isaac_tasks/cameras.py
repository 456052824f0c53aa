"""The camera factors on Isaac Lab's tasks, re-rendered: each camera's mount moved and turned (`camera_pose`), its
focal length scaled (`camera_fov`), as MuJoCo-SO101-PickCube-v0's renderer does them (mujoco_so101.rendered).

`camera_pose=L` moves a camera's mount by L cm and turns it by L degrees, each in a direction drawn per episode and
camera (a pure function of seed, level, episode and camera: paired across models), in the frame the camera rides: the
world for a fixed camera, its link for the SO-101's wrist camera (which then moves with the arm, mounted askew).
`camera_fov=L` scales every camera's focal length by L (its field of view narrower above 1), the same for all envs:
Isaac Lab's Newton warp renderer shares one ray field across envs ("Newton Warp requires identical camera intrinsics
across environments"), which a suite's run has (one level per run).

Both write into what the renderer reads: the camera's site in the Newton model (its local offset, through the camera's
frame view) and the camera's intrinsic matrices (`Camera.set_intrinsic_matrices`). Nominal episodes write nothing, so
their frames and physics are bit for bit what they were; an env whose camera was moved gets its nominal mount back
at its next nominal reset.

    CameraMounts(cameras, num_envs).lay(ids, episodes, scene_factor)   at each reset, after the scene's own reset
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

CAMERA_FACTORS = ("camera_pose", "camera_fov")


def quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product of (x, y, z, w) quaternions (Isaac Lab 3.0's and warp's order)."""
    ax, ay, az, aw = a.unbind(-1)
    bx, by, bz, bw = b.unbind(-1)
    return torch.stack([aw * bx + ax * bw + ay * bz - az * by, aw * by - ax * bz + ay * bw + az * bx,
                        aw * bz + ax * by - ay * bx + az * bw, aw * bw - ax * bx - ay * by - az * bz], dim=-1)


def mount_offset(level: float, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """camera_pose=`level`: (a translation of `level` cm, a turn of `level` degrees as an (x, y, z, w) quaternion),
    each about a direction drawn from `rng`."""
    def unit() -> np.ndarray:
        v = rng.standard_normal(3)
        return v / np.linalg.norm(v)

    move = torch.tensor(unit() * level / 100.0, dtype=torch.float32)
    half = math.radians(level) / 2
    turn = torch.tensor([*(math.sin(half) * unit()), math.cos(half)], dtype=torch.float32)
    return move, turn


class CameraMounts:
    """The task's cameras (name -> Isaac Lab `Camera`, in a fixed order) laid out per episode by a camera factor."""

    def __init__(self, cameras: dict[str, Any], num_envs: int):  # name -> isaaclab.sensors.Camera
        self.cameras = cameras
        self.nominal: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # local pos, quat, K
        self.moved = torch.zeros(num_envs, dtype=torch.bool)  # envs whose mounts are not nominal
        self.focal = 1.0  # the focal-length scale the cameras render with now

    def _nominal(self, name: str, cam) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The camera's mounts (local offsets from what it rides) and intrinsics as the scene made them."""
        if name not in self.nominal:
            pos, quat = cam._view.get_local_poses()  # the site offsets the renderer's camera poses come from
            self.nominal[name] = (pos.torch.clone(), quat.torch.clone(), cam.data.intrinsic_matrices.torch.clone())
        return self.nominal[name]

    def lay(self, ids: list[int], episodes: list[int], scene_factor: tuple[str, float, int] | None) -> None:
        """The envs `ids`, starting episodes `episodes`, see through cameras as `scene_factor` says (nominal where it
        is not a camera factor)."""
        from roboloop.sim.factors import draw

        factor, level, seed = scene_factor if scene_factor is not None else (None, 0.0, 0)
        focal = float(level) if factor == "camera_fov" else 1.0
        if focal != self.focal:
            for name, cam in self.cameras.items():
                k = self._nominal(name, cam)[2].clone()
                k[:, 0, 0] *= focal
                k[:, 1, 1] *= focal
                cam.set_intrinsic_matrices(k)
            self.focal = focal
        move = [i for i in ids if factor == "camera_pose" or bool(self.moved[i])]
        if not move:
            return
        for c, (name, cam) in enumerate(self.cameras.items()):
            pos0, quat0, _ = self._nominal(name, cam)
            pos, quat = pos0[move].clone(), quat0[move].clone()
            if factor == "camera_pose":
                for j, e in enumerate(episodes[ids.index(i)] for i in move):
                    d_pos, d_quat = mount_offset(float(level), draw(seed, "camera_pose", level, e, -3 - c))
                    pos[j] += d_pos.to(pos)
                    quat[j] = quat_mul(quat[j], d_quat.to(quat))
            _write(cam, pos, quat, move)
        self.moved[move] = factor == "camera_pose"


def _write(cam, pos: torch.Tensor, quat: torch.Tensor, envs: list[int]) -> None:
    """Set the mounts of `envs` and have the camera (and its renderer) take the poses they give now."""
    import warp as wp

    index: Any = wp.array(np.asarray(envs, dtype=np.int32), dtype=wp.int32, device=str(pos.device))
    cam._view.set_local_poses(wp.from_torch(pos.contiguous(), dtype=wp.vec3f),
                              wp.from_torch(quat.contiguous(), dtype=wp.vec4f), index)
    cam.reset(env_ids=envs)  # re-reads each camera's world pose from its mount
