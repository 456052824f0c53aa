"""The keypoint image encoder: spatial softmax against hand-computed positions, shapes through the policy."""

from __future__ import annotations

import math

import pytest
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


def _batch(cfg, n=3, aux_dim=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = [Sample([torch.rand(3, 64, 64, generator=g)], torch.randint(0, 256, (7,), generator=g),
                torch.randn(4, generator=g), torch.randn(cfg.horizon, 2, generator=g),
                torch.ones(cfg.horizon, dtype=torch.bool),
                aux=torch.randn(aux_dim, generator=g) if aux_dim else None) for _ in range(n)]
    return collate(s, cfg.tokens_per_image)


def test_auxiliary_target_adds_its_weighted_l1_to_the_flow_loss_and_trains_the_encoder():
    """The privileged-state head: the loss is flow + weight * mean |prediction - target| (hand-computed here from
    the model's own prediction), its gradient reaches the image stem, and acting needs no target."""
    torch.manual_seed(0)
    cfg = tiny(state_dim=4, action_dim=2, image_encoder="keypoints", keypoints=8, horizon=4, aux_dim=5)
    model = VLAPolicy(cfg)
    b = _batch(cfg, aux_dim=5)
    assert b.aux.shape == (3, 5)
    noise, u = torch.randn(3, 4, 2), torch.rand(3)
    _, _, _, pred = model.encode_with_aux(b)
    assert pred.shape == (3, 5)  # one prediction per image
    want_aux = (pred - b.aux).abs().mean()
    model.aux_weight = 0.0
    flow = model.loss(b, noise=noise, u=u)
    model.aux_weight = 0.3
    total = model.loss(b, noise=noise, u=u)
    assert math.isclose(total.item(), flow.item() + 0.3 * want_aux.item(), rel_tol=1e-5)
    model.zero_grad()
    (total - flow.detach()).backward()  # the flow term's graph is separate; check the aux term alone reaches the stem
    assert model.vision.stem[0].weight.grad.abs().sum() > 0
    no_target = _batch(cfg, aux_dim=0)
    assert no_target.aux.shape == (3, 0) and model.aux_loss(pred, no_target) is None
    assert model.sample_actions(no_target).shape == (3, 4, 2)


def test_keypoints_to_state_feeds_each_cameras_keypoints_to_the_state_mlp():
    cfg = tiny(state_dim=4, action_dim=2, image_encoder="keypoints", keypoints=8, horizon=4, keypoints_to_state=True)
    model = VLAPolicy(cfg)
    assert model.state_proj[0].in_features == 4 + cfg.max_cameras * 8 * 3
    b = _batch(cfg)
    seen = []
    orig = model._state_tokens
    model._state_tokens = lambda x: seen.append(x) or orig(x)  # type: ignore[method-assign]
    with torch.no_grad():
        model.encode(b)
        kp = model.vision.keypoints(b.images)  # (3 images, 8, 3)
    (x,) = seen
    torch.testing.assert_close(x[:, :4], b.states)
    slots = x[:, 4:].reshape(3, cfg.max_cameras, 8 * 3)
    torch.testing.assert_close(slots[:, 0], kp.flatten(1))  # camera 0 of each sample: its image's keypoints
    assert slots[:, 1:].abs().sum() == 0  # absent cameras: zeros
    for bad in ({"image_encoder": "patch"}, {"state_encoder": "per_dim"}):
        with pytest.raises(ValueError, match="keypoints_to_state needs"):
            VLAPolicy(cfg.model_copy(update=bad))


def test_aux_to_state_feeds_each_cameras_detached_prediction_to_the_state_mlp():
    """The policy acts on what its head perceived: the state MLP reads the auxiliary prediction of each camera slot
    (after the keypoints), detached, so only the auxiliary loss trains the head."""
    torch.manual_seed(0)
    cfg = tiny(state_dim=4, action_dim=2, image_encoder="keypoints", keypoints=8, horizon=4, keypoints_to_state=True,
               aux_dim=5, aux_to_state=True)
    model = VLAPolicy(cfg)
    kp_dim = cfg.max_cameras * 8 * 3
    assert model.state_proj[0].in_features == 4 + kp_dim + cfg.max_cameras * 5
    b = _batch(cfg, aux_dim=5)
    seen = []
    orig = model._state_tokens
    model._state_tokens = lambda x: seen.append(x) or orig(x)  # type: ignore[method-assign]
    with torch.no_grad():
        _, _, _, pred = model.encode_with_aux(b)
    slots = seen[0][:, 4 + kp_dim:].reshape(3, cfg.max_cameras, 5)
    torch.testing.assert_close(slots[:, 0], pred)  # camera 0 of each sample: its image's prediction
    assert slots[:, 1:].abs().sum() == 0
    model.aux_weight = 0.0  # the flow loss alone: it must not reach the head through the state path
    model.loss(b).backward()
    assert model.aux_head[0].weight.grad is None or model.aux_head[0].weight.grad.abs().sum() == 0
    assert model.state_proj[0].weight.grad[:, 4 + kp_dim:].abs().sum() > 0  # but the state MLP does use it
    for bad in ({"aux_dim": 0}, {"state_encoder": "per_dim", "keypoints_to_state": False}):
        with pytest.raises(ValueError, match="aux_to_state needs"):
            VLAPolicy(cfg.model_copy(update=bad))
