"""The reach task's scripted experts and its differential IK, in plain torch (no simulator needed)."""

from __future__ import annotations

import math

import torch

from roboloop.sim.assets import LINK1, LINK2

JOINT_LIMIT = 2.9  # rad (the USD limits are +-170 deg)


def fingertip(q: torch.Tensor) -> torch.Tensor:
    """(N, 2) fingertip xy of joint positions `q` (N, 2) (forward kinematics)."""
    a1, a12 = q[:, 0], q[:, 0] + q[:, 1]
    return torch.stack([LINK1 * torch.cos(a1) + LINK2 * torch.cos(a12),
                        LINK1 * torch.sin(a1) + LINK2 * torch.sin(a12)], dim=-1)


def jacobian(q: torch.Tensor) -> torch.Tensor:
    """(N, 2, 2) d fingertip / d joints at `q`."""
    a1, a12 = q[:, 0], q[:, 0] + q[:, 1]
    s1, c1, s12, c12 = torch.sin(a1), torch.cos(a1), torch.sin(a12), torch.cos(a12)
    return torch.stack([torch.stack([-LINK1 * s1 - LINK2 * s12, -LINK2 * s12], -1),
                        torch.stack([LINK1 * c1 + LINK2 * c12, LINK2 * c12], -1)], -2)


def dls_step(jac: torch.Tensor, dx: torch.Tensor, damping: float) -> torch.Tensor:
    """Joint step (N, 2) for a fingertip step `dx` (N, 2): J^T (J J^T + lambda^2 I)^-1 dx."""
    jjt = jac @ jac.transpose(1, 2) + damping**2 * torch.eye(2, device=jac.device)
    return (jac.transpose(1, 2) @ torch.linalg.solve(jjt, dx.unsqueeze(-1))).squeeze(-1)


def ee_expert(tip: torch.Tensor, goal: torch.Tensor, zone: float = 0.10) -> torch.Tensor:
    """Straight-line fingertip motion: the error over the linear zone, its norm capped at 1 (direction kept)."""
    v = (goal - tip) / zone
    return v / v.norm(dim=-1, keepdim=True).clamp_min(1.0)


def joint_expert(q: torch.Tensor, goal: torch.Tensor, action_scale: float = 0.08, zone: float = 0.3,
                 ) -> torch.Tensor:
    """Analytic two-link IK to `goal`, a proportional step towards it in joint space.

    Of the two IK branches it takes the one nearer the current joints (and inside the joint
    limits), so it never swings through the singularity or parks against a limit. `zone` is the
    joint error (rad) where the command saturates; `action_scale` (the env's rad per unit action)
    is where a saturated expert (zone = action_scale) would reach the target in one step.
    """
    x, y = goal[:, 0], goal[:, 1]
    c2 = ((x * x + y * y - LINK1**2 - LINK2**2) / (2 * LINK1 * LINK2)).clamp(-1.0, 1.0)
    best = None
    for sign in (1.0, -1.0):
        q2 = sign * torch.acos(c2)
        q1 = torch.atan2(y, x) - torch.atan2(LINK2 * torch.sin(q2), LINK1 + LINK2 * torch.cos(q2))
        cand = torch.stack([_wrap(q1 - q[:, 0]) + q[:, 0], q2], dim=-1)
        dist = (cand - q).abs().sum(-1) + 100.0 * (cand[:, 0].abs() > JOINT_LIMIT - 0.05)  # stay inside limits
        best = (cand, dist) if best is None else (torch.where((dist < best[1])[:, None], cand, best[0]),
                                                   torch.minimum(dist, best[1]))
    assert best is not None
    return ((best[0] - q) / max(zone, action_scale)).clamp(-1.0, 1.0)


def _wrap(a: torch.Tensor) -> torch.Tensor:
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi
