"""A new version's actions against the serving version's range: a promotion whose check chunk leaves the range the
champion was trained on (its dataset's action statistics) by more than a margin is refused, and the champion keeps
serving.

The gate judges success rates; it does not look at what a model tells the motors. A version whose chunks alternate
+-90 degrees was promoted and swapped in under a connected robot. The robot's own envelope
(`roboloop.serving.envelope`) refuses such chunks whatever the server does; this is the server's half: it never
offers them. The reference is the *serving* version's statistics, never the new version's own (a folder may claim
any range it likes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

MARGIN = 0.25  # of the reference range's width, on each side
STD_SPAN = 4.0  # a dataset whose statistics have no min/max: mean +- 4 std


def reference_range(policy: Any) -> tuple[np.ndarray, np.ndarray, str] | None:
    """(low, high, where from) of the actions `policy` was trained on, from its dataset statistics; None when it
    records none."""
    stats = getattr(policy, "stats", None) or {}
    s = stats.get(getattr(policy, "action_key", "action")) or stats.get("action") or {}
    try:
        if "min" in s and "max" in s:
            return np.asarray(s["min"], np.float64).ravel(), np.asarray(s["max"], np.float64).ravel(), "min/max"
        if "mean" in s and "std" in s:
            mean, std = np.asarray(s["mean"], np.float64).ravel(), np.asarray(s["std"], np.float64).ravel()
            return mean - STD_SPAN * std, mean + STD_SPAN * std, f"mean +- {STD_SPAN:g} std"
    except (TypeError, ValueError):
        return None
    return None


def refusal(serving: Any, new: Any, margin: float = MARGIN) -> str | None:
    """Why `new` (a ModelSlot with its `check_chunk`) must not replace `serving`, or None. Versions of another
    action size are not compared (they are served to new connections only, and the robot's envelope checks
    them)."""
    ref = reference_range(serving.policy)
    chunk = getattr(new, "check_chunk", None)
    if ref is None or chunk is None:
        return None
    low, high, source = ref
    a = np.asarray(chunk, np.float64).reshape(-1, np.asarray(chunk).shape[-1])
    if a.shape[1] != low.size:
        return None
    pad = margin * np.maximum(high - low, 1e-6)
    out = (a < low - pad) | (a > high + pad)
    if not out.any():
        return None
    k, j = np.argwhere(out)[0]
    return (f"its check chunk's action {j} is {a[k, j]:.6g}, outside {serving.version}'s training range "
            f"[{low[j]:.6g}, {high[j]:.6g}] ({source}) by more than {margin:.0%} of it")
