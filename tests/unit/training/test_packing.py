"""Packing is exact: packed and one-by-one forward/backward agree, and samples never mix."""

from __future__ import annotations

import pytest
import torch

from roboloop.training.attention import block_diagonal_mask, cu_seqlens, varlen_attention
from roboloop.training.config import tiny
from roboloop.training.model import VLAPolicy
from roboloop.training.packing import Sample, collate, nonpad_fraction, pack

CFG = tiny(image_size=(32, 32), patch_size=8, dim=32, heads=4, head_dim_model=32, head_heads=4, horizon=4)


def make_samples(n: int, seed: int = 0) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        cams = 1 + i % 3
        length = 3 + (7 * i) % 11
        out.append(Sample(
            images=[torch.rand(3, 32, 32, generator=g) for _ in range(cams)],
            instruction=torch.randint(0, 256, (length,), generator=g),
            state=torch.randn(CFG.state_dim, generator=g),
            actions=torch.randn(CFG.horizon, CFG.action_dim, generator=g),
            action_mask=torch.tensor([True] * (CFG.horizon - i % 2) + [False] * (i % 2)),
        ))
    return out


def velocities(model, batch, x_t, t):
    ctx, cu, max_len = model.encode(batch)
    return model.velocity(ctx, cu, max_len, x_t, t)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = VLAPolicy(CFG)
    for blk in m.head_blocks:  # AdaLN-Zero starts as identity; give it weights so the test sees it
        torch.nn.init.normal_(blk.ada.weight, std=0.05)
    return m.double()


def test_sdpa_block_mask_equals_per_sample_attention():
    g = torch.Generator().manual_seed(1)
    lens = [3, 7, 1, 5]
    cu = cu_seqlens(lens)
    q, k, v = (torch.randn(sum(lens), 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out = varlen_attention(q, k, v, cu, cu, max(lens), max(lens), backend="sdpa")
    for i in range(len(lens)):
        s, e = int(cu[i]), int(cu[i + 1])
        ref = torch.softmax(q[s:e].transpose(0, 1) @ k[s:e].transpose(0, 1).transpose(1, 2) / 8**0.5, -1) \
            @ v[s:e].transpose(0, 1)
        torch.testing.assert_close(out[s:e], ref.transpose(0, 1), rtol=0, atol=1e-12)
    causal = block_diagonal_mask(cu, cu, sum(lens), sum(lens), causal=True)
    assert causal[int(cu[1]) + 2, int(cu[1])] and not causal[int(cu[1]), int(cu[1]) + 2]


def test_packed_forward_and_grads_match_one_by_one(model):
    samples = make_samples(5)
    g = torch.Generator().manual_seed(2)
    x_t = torch.randn(5, CFG.horizon, CFG.action_dim, generator=g, dtype=torch.float64)
    t = torch.rand(5, generator=g, dtype=torch.float64)
    w = torch.randn(5, CFG.horizon, CFG.action_dim, generator=g, dtype=torch.float64)
    batch = collate(samples, CFG.tokens_per_image)
    batch.images, batch.states = batch.images.double(), batch.states.double()
    model.zero_grad()
    packed = velocities(model, batch, x_t, t)
    (packed * w).sum().backward()
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    singles = []
    for i, s in enumerate(samples):
        b = collate([s], CFG.tokens_per_image)
        b.images, b.states = b.images.double(), b.states.double()
        v = velocities(model, b, x_t[i:i + 1], t[i:i + 1])
        (v * w[i:i + 1]).sum().backward()
        singles.append(v)
    assert (torch.cat(singles) - packed).abs().max().item() <= 1e-5
    for n, p in model.named_parameters():
        if n in packed_grads:
            assert (packed_grads[n] - p.grad).abs().max().item() <= 1e-5, n


def test_perturbing_one_sample_leaves_others_unchanged(model):
    samples = make_samples(4)
    x_t = torch.randn(4, CFG.horizon, CFG.action_dim, dtype=torch.float64)
    t = torch.rand(4, dtype=torch.float64)

    def run(ss):
        b = collate(ss, CFG.tokens_per_image)
        b.images, b.states = b.images.double(), b.states.double()
        with torch.no_grad():
            return velocities(model, b, x_t, t)

    before = run(samples)
    samples[2].images[0] = torch.rand(3, 32, 32)
    samples[2].instruction = torch.randint(0, 256, (9,))
    after = run(samples)
    assert not torch.allclose(before[2], after[2])
    for i in (0, 1, 3):  # unchanged up to summation order (the pack's length changed)
        torch.testing.assert_close(before[i], after[i], rtol=0, atol=1e-12)


def test_pack_respects_budget_and_counts_nonpad():
    samples = make_samples(12)
    budget = 60
    packs = list(pack(samples, budget, CFG.tokens_per_image))
    assert sum(p.num_samples for p in packs) == 12
    assert all(int(p.seq_lens.sum()) <= budget for p in packs)
    frac = nonpad_fraction(packs, budget)
    assert 0.5 < frac <= 1.0
    with pytest.raises(ValueError, match="more than the pack budget"):
        list(pack(samples, 10, CFG.tokens_per_image))


def test_loss_averages_only_valid_steps(model):
    b = collate(make_samples(2), CFG.tokens_per_image)
    b.images, b.states, b.actions = b.images.double(), b.states.double(), b.actions.double()
    errors = model.step_errors(b, generator=torch.Generator().manual_seed(3))
    b.action_mask[:] = False
    b.action_mask[1, 2] = True
    loss = model.loss(b, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(loss, errors[1, 2])


def test_uint8_frames_reach_the_model_as_the_host_float_path_made_them():
    """Training batches carry colour frames as uint8 (a quarter of the bytes to stack, pin and copy) and scale
    them where the batch is; the values are those `to_model_input` makes on the host, so models see no change."""
    import numpy as np

    from roboloop.datasets.cameras import to_model_input, to_training_input

    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (1, 24, 32, 3), dtype=np.uint8) for _ in range(3)]
    depth = rng.uniform(400, 900, (1, 24, 32, 1)).astype(np.float32)

    def samples(fn, with_depth: bool) -> list[Sample]:
        base = make_samples(3)
        for s, f in zip(base, frames, strict=True):
            s.images = [fn(f)[0]] + ([fn(depth, (300.0, 1000.0))[0]] if with_depth else [])
        return base

    for with_depth in (False, True):
        new, old = collate(samples(to_training_input, with_depth), 4), collate(samples(to_model_input, with_depth), 4)
        assert new.images.dtype == (torch.float32 if with_depth else torch.uint8)  # depth: one float stack
        assert old.images.dtype == torch.float32
        for dtype in (torch.float32, torch.bfloat16):
            assert torch.equal(new.image_input(dtype), old.image_input(dtype))
    model = VLAPolicy(tiny(image_size=(24, 32), patch_size=8, dim=32, heads=4, head_dim_model=32, head_heads=4,
                           horizon=4)).eval()
    tpi = model.cfg.tokens_per_image
    new, old = collate(samples(to_training_input, False), tpi), collate(samples(to_model_input, False), tpi)
    torch.manual_seed(0)
    a = model.loss(new)
    torch.manual_seed(0)
    assert torch.equal(a, model.loss(old))
