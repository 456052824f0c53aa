"""The reach task's experts and differential IK by hand (plain torch, no simulator)."""

from __future__ import annotations

import math


def test_expert_controllers_by_hand():
    import torch

    from roboloop.sim.assets import LINK1, LINK2
    from roboloop.sim.isaac_tasks.controllers import dls_step, ee_expert, jacobian, joint_expert

    tip = torch.tensor([[0.30, 0.0], [0.30, 0.0]])
    goal = torch.tensor([[0.33, 0.04], [0.30, -0.5]])
    a = ee_expert(tip, goal, zone=0.1)
    assert torch.allclose(a[0], torch.tensor([0.3, 0.4]))  # inside the linear zone: error / zone
    assert torch.allclose(a[1], torch.tensor([0.0, -1.0]))  # outside: unit norm, same direction
    # straight arm along x: J = [[0, 0], [L1 + L2, L2]]; a y-step moves the shoulder (least squares, damped)
    jac = torch.tensor([[[0.0, 0.0], [LINK1 + LINK2, LINK2]]])
    assert torch.allclose(jacobian(torch.zeros(1, 2)), jac, atol=1e-7)
    dq = dls_step(jac, torch.tensor([[0.0, 0.01]]), damping=0.01)
    assert torch.allclose(jac @ dq.unsqueeze(-1), torch.tensor([[[0.0], [0.01]]]), atol=1e-5)
    # ... and a step along the singular direction (stretching a straight arm) moves nothing instead of blowing up
    assert torch.allclose(dls_step(jac, torch.tensor([[0.01, 0.0]]), damping=0.01), torch.zeros(1, 2))
    # joint expert at its IK solution commands nothing, and 0.15 rad away half its saturation
    x, y = LINK1 + LINK2 * math.cos(0.8), LINK2 * math.sin(0.8)
    at = joint_expert(torch.tensor([[0.0, 0.8]]), torch.tensor([[x, y]]), zone=0.3)
    assert at.abs().max() < 1e-5
    near = joint_expert(torch.tensor([[0.15, 0.8]]), torch.tensor([[x, y]]), zone=0.3)
    assert torch.allclose(near, torch.tensor([[-0.5, 0.0]]), atol=1e-4)
