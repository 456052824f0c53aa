"""How `roboloop serve` sizes itself on a CPU when not told: torch threads for its forward passes, and whether to
batch, each timed on the model's own check observation at start."""

from __future__ import annotations

import time

import torch

from roboloop.policies.precision import noise_kept, probe_obs
from roboloop.serving.service import ModelSlot, concat


def choose_threads(slot: ModelSlot, cores: int, repeats: int = 5, gain: float = 1.2,
                   budget_s: float = 1.5) -> tuple[int, str]:
    """Torch threads for the server's forward passes on a CPU: one core is left to the event loop, the message
    (de)coding and a local client unless the model's forward pass is compute-bound, i.e. timed on the check
    observation (the two counts in turn, at least `repeats` times each and for up to `budget_s`, fastest times
    compared: another tenant's load only ever slows a pass) it runs at least `gain` times faster on every core.
    Measured on 2 cores (bench/serve.py --server-threads 1 or 2): the demo's VLA (small kernels) served at
    10.3 ms p50 on one thread and 18.6 ms on two (the client and the loop then fight its threads); LeRobot's ACT
    on a 480x640 camera at 422 ms on one and 262 ms on two. With medians of 5 on a shared host whose speed
    drifts 40% from second to second, ACT at 96x128 was once timed 1.03x on two cores and served on one."""
    if cores <= 1:
        return 1, "one core"
    obs = probe_obs(slot.policy)
    times: dict[int, list[float]] = {cores - 1: [], cores: []}
    with noise_kept(slot.policy):
        start, i = time.perf_counter(), 0
        while i <= repeats or (time.perf_counter() - start < budget_s and i <= 10 * repeats):
            for threads, seen in times.items():
                torch.set_num_threads(threads)
                t0 = time.perf_counter()
                slot.policy.act(obs)
                if i:  # the first round warms each thread count up
                    seen.append(time.perf_counter() - t0)
            i += 1
    fewer, every = (min(t) for t in times.values())
    speedup = fewer / max(every, 1e-9)
    if speedup >= gain:
        chosen, why = cores, f"compute-bound: {speedup:.2f}x faster on all {cores} cores"
    else:
        chosen, why = cores - 1, f"one core left to the network side: {speedup:.2f}x on all {cores} cores"
    torch.set_num_threads(chosen)
    return chosen, why


def choose_batching(slot: ModelSlot, rows: int = 8, repeats: int = 2, gain: float = 1.1) -> tuple[int, str]:
    """`roboloop serve`'s batch size on a CPU when none is given: 64 observations, unless one forward pass over
    `rows` of them (timed on the check observation, alternating with `rows` passes over one, the fastest of
    `repeats` each) is not at least `gain` times faster per observation; then 1, no batching. Measured on 2 cores
    (bench/serve.py): the demo's VLA 2.85x, ACT at 96x128 1.88x, ACT at 480x640 1.01x, where the batching server
    gave 0.74x the unbatched chunks/s at 8 clients."""
    one = probe_obs(slot.policy)
    many = concat([one] * rows)
    singles: list[float] = []
    batched: list[float] = []
    with noise_kept(slot.policy):
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            for _ in range(rows):
                slot.policy.act(one)
            t1 = time.perf_counter()
            slot.policy.act(many)
            if i:  # the first round warms both up
                singles.append(t1 - t0)
                batched.append(time.perf_counter() - t1)
    speedup = min(singles) / max(min(batched), 1e-9)
    if speedup >= gain:
        return 64, f"a pass over {rows} observations {speedup:.2f}x faster than {rows} over one"
    return 1, f"no batching: a pass over {rows} observations only {speedup:.2f}x faster than {rows} over one"
