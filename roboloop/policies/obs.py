"""What a policy reads: one batched observation (`Obs`), as every environment backend and the policy server hand it
over, and the per-row generator a sampling policy draws its noise from (`row_generator`)."""

from __future__ import annotations

from dataclasses import dataclass, field

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
