"""Frozen norms folded into their convs and channels-last weights (`roboloop.training.convs`): LeRobot's own ACT,
unchanged, is the reference. The same weights must give the same loss and the same gradients, an optimiser step
must keep them together, and the state dict must be LeRobot's (same keys, read back by an unmodified ACT)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from roboloop import availability
from roboloop.training import convs, precision
from tests.conformance.cases import LEROBOT_QUIET

pytestmark = LEROBOT_QUIET


def _act(h: int = 48, w: int = 64):
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    cfg = ACTConfig(device="cpu", pretrained_backbone_weights=None, dim_model=32, dim_feedforward=64,
                    n_encoder_layers=1, n_decoder_layers=1, n_heads=2, latent_dim=8, chunk_size=5, n_action_steps=5)
    cfg.input_features = {"observation.state": PolicyFeature(FeatureType.STATE, (4,)),
                          "observation.images.top": PolicyFeature(FeatureType.VISUAL, (3, h, w))}
    cfg.output_features = {"action": PolicyFeature(FeatureType.ACTION, (4,))}
    torch.manual_seed(0)
    policy = ACTPolicy(cfg)
    with torch.no_grad():  # frozen norms that are not the identity, so that folding them matters
        for m in policy.modules():
            if isinstance(m, FrozenBatchNorm2d):
                m.weight.uniform_(0.5, 1.5), m.bias.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.3, 0.3), m.running_var.uniform_(0.5, 2.0)
    return policy


def _batch(n: int = 3, h: int = 48, w: int = 64) -> dict:
    g = torch.Generator().manual_seed(1)
    return {"observation.state": torch.randn(n, 4, generator=g), "action": torch.randn(n, 5, 4, generator=g),
            "action_is_pad": torch.zeros(n, 5, dtype=torch.bool),
            "observation.images.top": torch.rand(n, 3, h, w, generator=g)}


def _loss_and_grads(policy, batch) -> tuple[float, dict]:
    torch.manual_seed(2)  # the same dropout masks on both sides (the folded convs draw nothing)
    loss, _ = policy.forward(batch)
    policy.zero_grad(set_to_none=True)
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


def test_folded_channels_last_act_computes_what_lerobots_act_computes():
    reference = _act()
    fast = copy.deepcopy(reference)
    done = convs.speed_up(fast)
    assert done == {"conv_layout": "channels_last", "frozen_norms_folded": 20,  # ResNet-18: 1 + 8 x 2 + 3
                    "relu_after_pool": 1}  # the stem's
    assert type(fast.model.backbone.maxpool) is convs.PoolThenReLU
    assert list(fast.state_dict()) == list(reference.state_dict())
    conv1 = fast.model.backbone.conv1
    assert type(conv1) is convs.FoldedConv2d and conv1.weight.is_contiguous(memory_format=torch.channels_last)
    batch = _batch()
    for step in range(2):  # the gradients, and the weights after an optimiser step on them
        a, ga = _loss_and_grads(reference, batch)
        b, gb = _loss_and_grads(fast, batch)
        assert abs(a - b) <= 1e-5 * abs(a), (step, a, b)
        assert ga.keys() == gb.keys() and any("backbone" in n for n in ga)
        for n in ga:
            scale = float(ga[n].abs().max()) + 1e-12
            assert float((ga[n] - gb[n]).abs().max()) <= 1e-4 * scale, (step, n)
        for policy in (reference, fast):
            with torch.no_grad():
                for p in policy.parameters():
                    if p.grad is not None:
                        p -= 1e-2 * p.grad
    # LeRobot's own ACT reads the folded model's weights, and acts as it does
    back = _act()
    back.load_state_dict({k: v.contiguous() for k, v in fast.state_dict().items()})
    fast.eval(), back.eval()
    with torch.no_grad():
        assert torch.allclose(fast.predict_action_chunk(batch), back.predict_action_chunk(batch), atol=1e-5)


def test_an_acting_act_folded_for_good_gives_lerobots_chunks():
    reference = _act().eval()
    acting = copy.deepcopy(reference)
    assert convs.fold_for_inference(acting) == 20
    assert acting.model.backbone.conv1.bias is not None  # the shift is the conv's bias now
    batch = _batch()
    with torch.no_grad():
        assert torch.allclose(acting.predict_action_chunk(batch), reference.predict_action_chunk(batch), atol=1e-5)


def test_only_a_conv_that_feeds_its_norm_is_folded():
    class Crossed(nn.Module):  # the norm comes before the conv in the data flow: folding would be wrong
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, bias=False)
            self.bn = FrozenBatchNorm2d(4)

        def forward(self, x):
            return self.conv(self.bn(x))

    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=True), FrozenBatchNorm2d(4), Crossed())  # a conv with a bias too
    assert convs.fold_frozen_norms(model) == 0
    assert convs.speed_up(nn.Sequential(nn.Linear(3, 3))) == {"conv_layout": None, "frozen_norms_folded": 0,
                                                             "relu_after_pool": 0}
    seq = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), FrozenBatchNorm2d(4))
    assert convs.fold_frozen_norms(seq) == 1 and convs.fold_frozen_norms(seq) == 0  # never twice


def test_the_stem_pools_before_its_relu_with_the_same_values_and_gradients_bit_for_bit():
    """ACT's stem (an IntermediateLayerGetter) and Diffusion's (an nn.Sequential of a ResNet's children), in fp32
    and bf16 autocast; a map with windows whose maximum is not positive, where the two orders pass no gradient."""
    from torchvision.models.resnet import resnet18

    stems = {"act": _act().model.backbone, "diffusion": nn.Sequential(*list(resnet18().children())[:-2])}
    for name, stem in stems.items():
        moved = copy.deepcopy(stem)
        assert convs.pool_before_relu(moved) == 1 and convs.pool_before_relu(moved) == 0, name  # never twice
        for bf16 in (False, True):
            x = torch.randn(2, 3, 48, 64, generator=torch.Generator().manual_seed(3)) - 0.5
            outs = []
            for model in (stem, moved):
                model.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    y = model(x)
                y = y["feature_map"] if isinstance(y, dict) else y
                (y.float() * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
                outs.append((y.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
            (ya, ga), (yb, gb) = outs
            assert torch.equal(ya, yb), (name, bf16)
            assert ga.keys() == gb.keys() and all(torch.equal(ga[n], gb[n]) for n in ga), (name, bf16)


def test_a_relu_held_twice_or_a_pool_that_returns_indices_stays_where_it_is():
    relu = nn.ReLU()
    shared = nn.Sequential(nn.Conv2d(3, 4, 3), relu, nn.MaxPool2d(2), nn.Conv2d(4, 4, 3), relu)
    assert convs.pool_before_relu(shared) == 0 and type(shared[1]) is nn.ReLU
    indices = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2, return_indices=True))
    assert convs.pool_before_relu(indices) == 0


def test_bf16_on_cpu_runs_only_where_the_cpu_has_it(monkeypatch):
    monkeypatch.setattr(availability, "cpu_bf16", lambda: None)
    with pytest.raises(availability.MissingCapability, match="neither AMX nor AVX512-BF16"):
        precision.plan("bf16", "cpu")
    monkeypatch.setattr(availability, "cpu_bf16", lambda: "AVX512-BF16")
    p = precision.plan("bf16", "cpu")
    assert p.name == "bf16" and "AVX512-BF16" in p.reason
    with p.autocast("cpu"):
        y = nn.Linear(8, 8)(torch.randn(2, 8))
    assert y.dtype == torch.bfloat16
    assert precision.plan("auto", "cpu").name == "fp32"  # never assumed


def test_a_model_that_trains_in_fp32_only_gets_fp32_from_auto_and_refuses_bf16():
    from roboloop.policies.lerobot import VQBET_FP32

    bf16 = precision.PrecisionPlan("bf16", "auto: bf16 (a GPU)")
    assert precision.fit(bf16, "auto", None) is bf16
    p = precision.fit(bf16, "auto", VQBET_FP32)
    assert p.name == "fp32" and "ema_inplace" in p.reason
    with pytest.raises(availability.MissingCapability, match="precision=bf16: vqbet trains in fp32 only"):
        precision.fit(precision.PrecisionPlan("bf16", "requested"), "bf16", VQBET_FP32)


@pytest.mark.gpu
def test_folded_channels_last_act_on_cuda_computes_what_lerobots_act_computes():
    if not torch.cuda.is_available():
        pytest.skip("needs 1 CUDA GPU(s), found 0")
    reference = _act().cuda()
    fast = copy.deepcopy(reference)
    convs.speed_up(fast)
    batch = {k: v.cuda() for k, v in _batch().items()}
    for autocast in (False, True):  # fp32 and bf16 autocast, as the trainer runs them
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            a, _ = _loss_and_grads(reference, batch)
            b, _ = _loss_and_grads(fast, batch)
        assert abs(a - b) <= 2e-2 * abs(a), (autocast, a, b)  # TF32 or bf16 convolutions on both sides
