"""Evaluation: batched environments (Isaac Lab, gymnasium), policies, the Evaluator, rollouts."""

import os as _os

# MuJoCo picks its OpenGL platform when it is first imported, and Newton (Isaac Lab's physics) imports it: offscreen
# EGL unless the caller chose another, so MuJoCo-SO101-PickCube-v0's cameras render in any process that evaluates
_os.environ.setdefault("MUJOCO_GL", "egl")
