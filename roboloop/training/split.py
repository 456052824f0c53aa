"""The train/validation split, by episode: a held-out episode never contributes a training sample.

The split is a pure function of the dataset's episode indices, the fraction and the seed; the
trained model records the held-out episodes in its config.json (`split`), which offline
evaluation reads back, so "held out" means the same thing to the trainer and the evaluator.
"""

from __future__ import annotations

import math

import numpy as np


def split_episodes(episodes: list[int], fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """(train, validation) episode indices; validation is round(fraction * n) episodes (at least one when
    fraction > 0), drawn by `seed`. Refuses a split that leaves nothing to train on."""
    eps = sorted(int(e) for e in episodes)
    if not 0 <= fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {fraction}")
    if fraction == 0 or not eps:
        return eps, []
    n_val = max(1, math.floor(fraction * len(eps) + 0.5))
    if n_val >= len(eps):
        raise ValueError(f"val_fraction {fraction} of {len(eps)} episodes leaves no episode to train on")
    order = np.random.default_rng(seed).permutation(len(eps))
    val = sorted(eps[i] for i in order[:n_val])
    held = set(val)
    return [e for e in eps if e not in held], val


def recorded_split(model_config: dict) -> dict | None:
    """The split a model folder's config.json records ({"train_episodes": [...], "validation_episodes": [...]})."""
    return model_config.get("split")
