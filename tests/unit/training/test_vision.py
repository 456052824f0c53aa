"""The keypoint image encoder: spatial softmax against hand-computed positions, shapes through the policy."""

from __future__ import annotations

import math

import torch

from roboloop.training.config import tiny
from roboloop.training.model import VLAPolicy
from roboloop.training.packing import Sample, collate
from roboloop.training.vision import KeypointEncoder, spatial_softmax


def test_spatial_softmax_finds_a_peak_and_reports_flat_maps():
    f = torch.zeros(1, 2, 5, 9)
    f[0, 0, 1, 6] = 50.0  # row 1 of 5 -> y = -0.5; column 6 of 9 -> x = 0.5
    kp = spatial_softmax(f, torch.tensor(1.0))
    assert torch.allclose(kp[0, 0, :2], torch.tensor([0.5, -0.5]), atol=1e-4)
    assert math.isclose(kp[0, 0, 2].item(), math.log(45), rel_tol=1e-4)  # all mass on one of 45 pixels
    assert torch.allclose(kp[0, 1], torch.zeros(3), atol=1e-6)  # flat: centre, no peak


def test_keypoint_tokens_replace_patches_in_the_policy():
    cfg = tiny(state_dim=4, action_dim=2, image_encoder="keypoints", keypoints=8, horizon=4)
    assert cfg.tokens_per_image == 8
    enc = KeypointEncoder(cfg.dim, 8)
    assert enc(torch.rand(3, 3, 64, 64)).shape == (3, 8, cfg.dim)
    model = VLAPolicy(cfg)
    g = torch.Generator().manual_seed(0)
    s = [Sample([torch.rand(3, 64, 64, generator=g)], torch.randint(0, 256, (7,)), torch.randn(4),
                torch.randn(4, 2), torch.ones(4, dtype=torch.bool)) for _ in range(2)]
    b = collate(s, cfg.tokens_per_image)
    loss = model.loss(b)
    loss.backward()
    assert model.vision.stem[0].weight.grad.abs().sum() > 0  # the image reaches the loss
    assert "patch.weight" not in model.state_dict()
