"""The gate's error rates, by simulation: how often a challenger is promoted when it is in truth `delta` worse than
the champion, with the early stop's looks and the gate's final test as the loop runs them.

Each simulated evaluation pairs `planned` episodes: the champion succeeds with probability `p`, the challenger with
`p - delta`, the two outcomes of an episode sharing their draw with probability `rho` (episodes that are easy or hard
for both, as paired initial states are). A run with the early stop looks every `look_every` episodes
(`binomial.early_decision`) and, when no look was certain, the gate tests the whole run (`registry._gate`), each
test at alpha / looks. At delta = margin (a challenger exactly as much worse as the gate tolerates) the promoted
fraction is the false-promotion rate the gate's alpha promises to bound; at delta = 0 it is the power.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Rates:
    promoted: float  # fraction of simulated runs promoted
    stopped_early: float  # fraction that an early look decided
    mean_episodes: float  # episodes played on average


def _pair(rng: random.Random, p: float, delta: float, rho: float) -> tuple[bool, bool]:
    u = rng.random()
    v = u if rng.random() < rho else rng.random()
    return u < p, v < p - delta


def promotion_rate(p: float, delta: float, rho: float = 0.0, planned: int = 96, look_every: int = 16,
                   margin: float = 0.05, alpha: float = 0.05, runs: int = 2000, seed: int = 0,
                   early_stop: bool = True, final_alpha_per_look: bool = True) -> Rates:
    """Promoted fraction over `runs` simulated evaluations (see the module's docstring). `final_alpha_per_look`
    False reproduces the earlier gate, which tested a sequential run's end at the full alpha."""
    from roboloop.binomial import early_decision, planned_looks
    from roboloop.registry import _gate

    rng = random.Random(seed)
    looks = planned_looks(planned, planned, look_every) if early_stop else 1
    promoted = stopped = played = 0
    for _ in range(runs):
        pairs = [_pair(rng, p, delta, rho) for _ in range(planned)]
        ref = "".join("1" if c else "0" for c, _ in pairs)
        n = planned
        for k in range(look_every, planned, look_every) if early_stop else ():
            if early_decision([x for _, x in pairs[:k]], ref, planned, look_every, margin, alpha):
                n, stopped = k, stopped + 1
                break
        new = "".join("1" if x else "0" for _, x in pairs[:n])
        run = {"task": "t", "seed": 0, "execute_steps": 4, "episodes": n, "successes": new.count("1"),
               "outcomes": new, "looks": looks if final_alpha_per_look else None}
        champion = {"task": "t", "seed": 0, "execute_steps": 4, "episodes": n, "successes": ref[:n].count("1"),
                    "outcomes": ref[:n]}
        ok, _ = _gate(run, champion, margin, alpha)
        promoted += ok
        played += n
    return Rates(promoted / runs, stopped / runs, played / runs)
