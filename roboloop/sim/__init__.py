"""Simulation: the batched environment protocol (protocol.py), the task registry (registry.py) and roboloop's tasks
declared there (tasks/), and the backends that run them: Isaac Lab (isaac.py, its tasks' envs in isaac_tasks/, the
CPU step graph cpu_graph.py, the shipped assets), MuJoCo (mujoco_so101.py) and gymnasium or LeRobot's environments
(gym_env.py). The perturbation factors a task's scene can apply are declared in factors.py.

    make_env(task, num_envs, device, seed, camera, overrides) -> BatchedEnv     any task the registry resolves
"""

from __future__ import annotations

import os as _os
from typing import Any

# MuJoCo picks its OpenGL platform when it is first imported, and Newton (Isaac Lab's physics) imports it: offscreen
# EGL unless the caller chose another, so MuJoCo-SO101-PickCube-v0's cameras render in any process that evaluates
_os.environ.setdefault("MUJOCO_GL", "egl")


def make_env(task: str, num_envs: int, device: str = "cpu", seed: int = 0, camera: bool = True,
             overrides: dict[str, Any] | None = None):
    """The batched env of any task the registry knows (roboloop.sim.registry.task); an unknown task is an
    `UnknownTaskError` listing the known ones."""
    from roboloop.sim.registry import task as task_spec

    return task_spec(task).make(num_envs, device, seed, camera, overrides)
