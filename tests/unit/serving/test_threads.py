"""The server's torch threads on a CPU (`choose_threads`): every core only for a forward pass that runs clearly
faster on them, else one core stays with the event loop and the client; the policy's noise stream untouched."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from roboloop.serving.service import ModelSlot
from roboloop.serving.tuning import choose_threads


class Timed:
    """A policy whose forward pass takes `work / threads**scaling` seconds."""

    state_key, state_dim, action_dim, horizon, camera_keys, image_size, stats = "s", 2, 2, 3, [], None, {}

    def __init__(self, scaling: float):
        self.scaling = scaling
        self.g = torch.Generator().manual_seed(0)

    def act(self, obs):
        time.sleep(0.02 / torch.get_num_threads() ** self.scaling)
        torch.randn(1, generator=self.g)  # draws from its noise stream, as a flow-matching policy does
        return torch.zeros(obs.state.shape[0], self.horizon, self.action_dim)


def test_every_core_only_for_a_compute_bound_forward_pass():
    before = torch.get_num_threads()
    try:
        for scaling, want in ((1.0, 2), (0.0, 1)):  # halves on two threads / no faster
            policy = Timed(scaling)
            state = policy.g.get_state()
            n, why = choose_threads(ModelSlot(policy, "v1", Path("."), "0" * 64), cores=2)
            assert n == want and torch.get_num_threads() == want, why
            assert ("compute-bound" in why) == (want == 2), why
            assert torch.equal(policy.g.get_state(), state)  # served chunks stay the in-process ones
        assert choose_threads(ModelSlot(Timed(1.0), "v1", Path("."), "0" * 64), cores=1) == (1, "one core")
    finally:
        torch.set_num_threads(before)


def busy(seconds: float) -> None:
    """Wait by spinning, not `time.sleep`: on a loaded machine each sleep overshoots by a few ms, a fixed cost per
    call that made eight short sleeps slower than one long one (seen in `make test`: 1.83x "faster" batched)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Batched(Timed):
    """A policy whose forward pass over N observations takes `per_pass + N * per_row` seconds, times `penalty` when
    N > 1 (at 480x640 LeRobot's ACT served a batch of 8 slower than 8 passes over one)."""

    def __init__(self, per_pass: float, per_row: float, penalty: float = 1.0):
        super().__init__(0.0)
        self.per_pass, self.per_row, self.penalty = per_pass, per_row, penalty

    def act(self, obs):
        n = obs.state.shape[0]
        busy((self.per_pass + n * self.per_row) * (self.penalty if n > 1 else 1.0))
        torch.randn(1, generator=self.g)
        return torch.zeros(obs.state.shape[0], self.horizon, self.action_dim)


def test_batching_only_where_a_batched_pass_is_faster_per_observation():
    from roboloop.serving.tuning import choose_batching

    # a fixed cost to share (4.5x faster batched) / none, and a batch slower than its rows one by one (0.67x);
    # wide margins on both sides of 1.1x, as a loaded machine preempts the spinning thread
    for per_pass, per_row, penalty, want in ((0.004, 0.0005, 1.0, 64), (0.0, 0.003, 1.5, 1)):
        policy = Batched(per_pass, per_row, penalty)
        state = policy.g.get_state()
        n, why = choose_batching(ModelSlot(policy, "v1", Path("."), "0" * 64))
        assert n == want, why
        assert ("no batching" in why) == (want == 1), why
        assert torch.equal(policy.g.get_state(), state)  # served chunks stay the in-process ones
