"""roboloop's AdamW (`roboloop.training.optim`): the fused kernel where every parameter takes it, the same update as
PyTorch's default loop, state that loads across the two, and the default kept (and said) where it cannot run."""

from __future__ import annotations

import copy

import torch
from torch import nn

from roboloop.training.optim import adamw


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4))


def _steps(model: nn.Module, opt: torch.optim.Optimizer, n: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)  # new targets: no vanishing gradient
        opt.zero_grad(set_to_none=True)
        (model(x) - y).square().mean().backward()
        opt.step()


def test_fused_gives_the_default_loops_update():
    a, b = _model(), _model()
    fused, label = adamw(a.parameters(), 1e-2, 1e-2)
    assert label == "AdamW, fused kernel" and fused.defaults["fused"]
    default = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=1e-2)
    _steps(a, fused, 8)  # (Adam divides by the gradient's running scale: rounding grows over many steps)
    _steps(b, default, 8)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, rtol=1e-5, atol=1e-6)
    moved = sum(float((pa - pb).detach().abs().max()) for pa, pb in zip(a.parameters(), _model().parameters(),
                                                                        strict=True))
    assert moved > 0.1  # the steps did move the weights: the comparison is not between two untouched models


def test_a_checkpoint_of_either_loads_into_the_other_and_continues_alike():
    """A run checkpointed before the fused optimizer resumes under it (and back), continuing as the default would."""
    a = _model()
    default = torch.optim.AdamW(a.parameters(), lr=1e-2, weight_decay=1e-2)
    _steps(a, default, 5)
    b = copy.deepcopy(a)
    fused, _ = adamw(b.parameters(), 1e-2, 1e-2)
    fused.load_state_dict(copy.deepcopy(default.state_dict()))  # as from a file: no state shared
    _steps(a, default, 5, seed=2)
    _steps(b, fused, 5, seed=2)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, rtol=1e-5, atol=1e-6)
    c = copy.deepcopy(b)
    back = torch.optim.AdamW(c.parameters(), lr=1e-2, weight_decay=1e-2)
    back.load_state_dict(copy.deepcopy(fused.state_dict()))
    _steps(b, fused, 3, seed=3)
    _steps(c, back, 3, seed=3)
    for pb, pc in zip(b.parameters(), c.parameters(), strict=True):
        assert torch.allclose(pb, pc, rtol=1e-5, atol=1e-6)


def test_a_parameter_the_kernel_does_not_take_keeps_the_default_and_says_so():
    m = _model()
    counter = nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False)  # not a float
    opt, label = adamw([*m.parameters(), counter], 1e-2, 0.0)
    assert not opt.defaults["fused"] and "default loop" in label
    _steps(m, opt, 2)  # and it trains
