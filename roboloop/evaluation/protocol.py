"""The batched environment protocol every backend implements, and a scripted env for tests.

An env holds `num_envs` copies that reset themselves when an episode ends (auto-reset).
`step` returns the observation after the step (for a finished env: the first observation
of its next episode), the reward, `done` (terminated or truncated) and `success` for the
episode that just ended (False where none ended).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch


@dataclass
class Obs:
    state: torch.Tensor  # (N, S) float32
    images: dict[str, torch.Tensor] = field(default_factory=dict)  # camera -> (N, H, W, 3) uint8
    instructions: list[str] = field(default_factory=list)  # N instructions ("" when the task has none)
    # (N, E) the scene's state (LeRobot's observation.environment_state; in roboloop's tasks privileged simulator
    # state): recorded with demonstrations; read only by policies trained with it as an input (LeRobot's ENV)
    env_state: torch.Tensor | None = None
    # for policies that read several frames (`history` > 1): the previous observations, oldest first
    past: list[Obs] | None = None
    # (N, 2) int64 (episode number, step in the episode), set by the Evaluator: a sampling policy draws each row's
    # noise from these, so an episode's draws do not depend on which other envs were batched with it
    keys: torch.Tensor | None = None

    def select(self, mask: torch.Tensor) -> Obs:
        idx = mask.nonzero().flatten()
        return Obs(self.state[idx], {k: v[idx] for k, v in self.images.items()},
                   [self.instructions[i] for i in idx.tolist()],
                   None if self.env_state is None else self.env_state[idx],
                   None if self.past is None else [p.select(mask) for p in self.past],
                   None if self.keys is None else self.keys[idx])

    def where(self, mask: torch.Tensor, other: Obs) -> Obs:
        """This observation with the envs in `mask` taken from `other` (same shapes)."""
        def mix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            m = mask.to(a.device).reshape(-1, *([1] * (a.ndim - 1)))
            return torch.where(m, b, a)
        return Obs(mix(self.state, other.state), {k: mix(v, other.images[k]) for k, v in self.images.items()},
                   self.instructions, self.env_state)


def row_generator(seed: int, key: torch.Tensor) -> torch.Generator:
    """A generator for one row's draws, from the run's seed and the row's (episode, step)."""
    e, t = (int(v) for v in key.tolist())
    return torch.Generator().manual_seed(((seed * 1_000_003 + e) * 10_000_019 + t) % (2**63))


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
