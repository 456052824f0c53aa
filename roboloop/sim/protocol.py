"""The batched environment protocol every backend implements, and a scripted env for tests.

An env holds `num_envs` copies that reset themselves when an episode ends (auto-reset).
`step` returns the observation after the step (for a finished env: the first observation
of its next episode), the reward, `done` (terminated or truncated) and `success` for the
episode that just ended (False where none ended).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from roboloop.policies.obs import Obs, row_generator  # noqa: F401  (what a policy reads: the policies' own module)


@dataclass
class StepResult:
    obs: Obs
    reward: torch.Tensor  # (N,)
    done: torch.Tensor  # (N,) bool: the episode ended at this step (the env has auto-reset)
    success: torch.Tensor  # (N,) bool: ... and it was a success


class BatchedEnv(Protocol):
    num_envs: int
    action_dim: int
    action_low: torch.Tensor  # (A,)
    action_high: torch.Tensor  # (A,)
    fps: int
    backend: str  # e.g. "isaaclab-newton-cpu", "gymnasium", "scripted"
    task: str

    def reset(self, seed: int | None = None) -> Obs: ...
    def step(self, actions: torch.Tensor) -> StepResult: ...
    def expert(self, obs: Obs) -> torch.Tensor | None: ...  # (N, A) scripted expert, None if the task has none
    def close(self) -> None: ...


class ScriptedEnv:
    """Deterministic env with known outcomes: env i's k-th episode lasts `lengths[i][k % len]` steps
    and succeeds iff `outcomes[i][k % len]`. Used to check the Evaluator's bookkeeping."""

    backend, task, fps, action_dim = "scripted", "scripted", 10, 1

    def __init__(self, lengths: list[list[int]], outcomes: list[list[bool]]):
        self.lengths, self.outcomes = lengths, outcomes
        self.num_envs = len(lengths)
        self.action_low, self.action_high = -torch.ones(1), torch.ones(1)
        self.t = np.zeros(self.num_envs, dtype=int)
        self.k = np.zeros(self.num_envs, dtype=int)
        self.episodes_started = self.num_envs

    def _obs(self) -> Obs:
        return Obs(torch.tensor(np.stack([self.t, self.k], 1), dtype=torch.float32),
                   {"cam": torch.zeros(self.num_envs, 8, 8, 3, dtype=torch.uint8)}, ["scripted"] * self.num_envs)

    def reset(self, seed: int | None = None) -> Obs:
        self.t[:] = 0
        self.k[:] = 0
        return self._obs()

    def step(self, actions: torch.Tensor) -> StepResult:
        assert actions.shape == (self.num_envs, 1)
        self.t += 1
        done = np.zeros(self.num_envs, dtype=bool)
        success = np.zeros(self.num_envs, dtype=bool)
        for i in range(self.num_envs):
            ls, os_ = self.lengths[i], self.outcomes[i]
            if self.t[i] >= ls[self.k[i] % len(ls)]:
                done[i], success[i] = True, os_[self.k[i] % len(os_)]
                self.k[i] += 1
                self.t[i] = 0
                self.episodes_started += 1
        return StepResult(self._obs(), torch.ones(self.num_envs), torch.from_numpy(done), torch.from_numpy(success))

    def expert(self, obs: Obs) -> torch.Tensor | None:
        return None

    def close(self) -> None:
        pass
