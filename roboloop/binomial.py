"""Binomial statistics for success rates: Wilson interval and a non-inferiority test."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def wilson(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval (95% by default) for a success proportion."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _norm_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def non_inferior(s_new: int, n_new: int, s_old: int, n_old: int, margin: float = 0.05,
                 alpha: float = 0.05) -> tuple[bool, float, str]:
    """Two-proportion z-test of H0: p_new <= p_old - margin against H1: p_new > p_old - margin.

    Returns (passed, p_value, reason). `passed` means the challenger is not worse than the
    champion by more than `margin`, at level `alpha`.
    """
    if n_new <= 0 or n_old <= 0:
        return False, 1.0, "no episodes to compare"
    p1, p0 = s_new / n_new, s_old / n_old
    se = math.sqrt(max(p1 * (1 - p1) / n_new + p0 * (1 - p0) / n_old, 1e-12))
    z = (p1 - p0 + margin) / se
    p_value = 1 - _norm_cdf(z)
    passed = p_value < alpha
    reason = (f"challenger {s_new}/{n_new} = {p1:.3f} vs champion {s_old}/{n_old} = {p0:.3f}, margin {margin}: "
              f"z = {z:.2f}, p = {p_value:.4f} {'<' if passed else '>='} {alpha}")
    return passed, p_value, reason


def outcomes_by_episode(per_episode: list[dict]) -> dict[int, bool]:
    """An evaluation report's `per_episode` rows as {episode number in start order: success} (unnumbered rows
    are left out): what paired comparisons line up."""
    return {int(e["index"]): bool(e["success"]) for e in per_episode if int(e.get("index", -1)) >= 0}


def paired_difference(challenger: dict[int, bool], champion: dict[int, bool], margin: float = 0.05,
                      z: float = 1.959963984540054) -> dict:
    """Challenger minus champion success on the same episodes (same initial states), paired by episode number.

    Returns the difference, its 95% interval (Wald on the per-episode differences, which only the discordant
    pairs move; their variance floored at 1/n, as if one pair were discordant), the decision (`not_worse`:
    the lower bound is above -margin; `worse`: the upper bound is below -margin; else `undecided`) and, when
    undecided, about how many paired episodes would decide it if the observed difference and spread held."""
    common = sorted(set(challenger) & set(champion))
    n = len(common)
    if n == 0:
        raise ValueError("no episode in common: evaluate both on the same task and seed")
    d = [int(challenger[k]) - int(champion[k]) for k in common]
    mean = sum(d) / n
    # at least one discordant pair's worth of spread: 16 concordant pairs do not prove "not worse" by 0.05
    var = max(sum((x - mean) ** 2 for x in d) / max(n - 1, 1), 1.0 / n)
    half = z * math.sqrt(var / n)
    lo, hi = mean - half, mean + half
    decision = "not_worse" if lo > -margin else "worse" if hi < -margin else "undecided"
    needed = None
    if decision == "undecided":
        gap = abs(mean + margin)
        sd = math.sqrt(var)
        needed = math.ceil((z * sd / gap) ** 2) if gap > 1e-9 else None  # None: no sample size decides a tie
    return {"episodes": n, "diff": mean, "ci_low": lo, "ci_high": hi, "margin": margin, "decision": decision,
            "discordant": sum(x != 0 for x in d), "episodes_needed": needed}


def pooled_paired_difference(pairs: Sequence[tuple[dict[int, bool], dict[int, bool], object]], margin: float = 0.05,
                             z: float = 1.959963984540054) -> dict:
    """Several paired comparisons pooled: the mean challenger-minus-champion difference over every pair's common
    episodes, with a 95% interval clustered by (group, episode number). Pairs in the same `group` (the third item:
    e.g. the task and evaluation seed) share their episodes' initial states, so their outcomes on one episode are
    not independent (three training seeds on the same 96 cubes are 96 clusters, not 288 draws); pairs in
    different groups are separate clusters. Variance: the cluster-robust sandwich with the G/(G-1) correction,
    floored, as `paired_difference`'s, at one discordant pair's worth; with one pair it equals
    `paired_difference`'s interval."""
    diffs: list[tuple[object, int, int]] = []
    for i, (challenger, champion, group) in enumerate(pairs):
        common = sorted(set(challenger) & set(champion))
        if not common:
            raise ValueError(f"no episode in common in pair {i + 1}: evaluate both on the same task and seed")
        diffs += [(group, k, int(challenger[k]) - int(champion[k])) for k in common]
    n = len(diffs)
    mean = sum(d for _, _, d in diffs) / n
    clusters: dict[tuple[object, int], float] = {}
    for group, k, d in diffs:
        clusters[(group, k)] = clusters.get((group, k), 0.0) + d - mean
    g = len(clusters)
    var_mean = max(g / max(g - 1, 1) * sum(v * v for v in clusters.values()) / n ** 2, 1.0 / n ** 2)
    half = z * math.sqrt(var_mean)
    lo, hi = mean - half, mean + half
    decision = "not_worse" if lo > -margin else "worse" if hi < -margin else "undecided"
    return {"pairs": len(pairs), "episodes": n, "clusters": g, "diff": mean, "ci_low": lo, "ci_high": hi,
            "margin": margin, "decision": decision, "discordant": sum(d != 0 for _, _, d in diffs)}


def paired_gate(new: str, old: str, margin: float = 0.05, alpha: float = 0.05) -> tuple[bool, str]:
    """The promotion gate on paired outcomes ('1'/'0' per episode in start order, same initial states).

    Passes when the one-sided (1 - alpha) lower bound of the paired difference is above -margin. When it
    neither passes nor fails at that level, the reason says about how many paired episodes would decide."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - alpha)
    r = paired_difference({i: c == "1" for i, c in enumerate(new)}, {i: c == "1" for i, c in enumerate(old)},
                          margin, z=z)
    more = f"; about {r['episodes_needed']} paired episodes would decide it" if r["episodes_needed"] else ""
    reason = (f"paired over {r['episodes']} episodes ({r['discordant']} discordant): challenger - champion = "
              f"{r['diff']:+.3f}, {100 * (1 - alpha):.0f}% lower bound {r['ci_low']:+.3f} vs -margin {-margin}: "
              f"{r['decision'].replace('_', ' ')}{more}")
    return r["decision"] == "not_worse", reason


def paired_error_gate(new: dict, old: dict, margin: float = 0.05, alpha: float = 0.05) -> tuple[bool, str]:
    """The promotion gate on offline errors (lower is better) paired by held-out episode: the challenger's
    per-episode error minus the champion's on the same episodes (same frames, same flow-matching noise).

    A t interval over episodes (an episode's frames are not independent). Passes when the one-sided
    (1 - alpha) upper bound of the mean difference is below `margin` times the champion's mean error."""
    from scipy import stats as sps

    common = sorted(set(new) & set(old))
    n = len(common)
    if n < 2:
        return False, f"offline: {n} held-out episode(s) in common; at least 2 are needed to compare"
    d = [float(new[k]) - float(old[k]) for k in common]
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    hi = mean + float(sps.t.ppf(1 - alpha, n - 1)) * sd / math.sqrt(n)
    base = sum(float(old[k]) for k in common) / n
    bound = margin * base
    ok = hi < bound
    verdict = "not worse" if ok else "worse" if mean - (hi - mean) > bound else "undecided"
    return ok, (f"offline, paired over {n} held-out episodes: challenger - champion normalised chunk MSE = "
                f"{mean:+.4f}, {100 * (1 - alpha):.0f}% upper bound {hi:+.4f} vs margin x champion "
                f"{bound:.4f}: {verdict}")


def planned_looks(planned: int, reference_episodes: int, look_every: int) -> int:
    """How many paired tests a run with the early stop makes: one every `look_every` episodes, the gate's final one
    on the whole run included; each spends alpha / looks (Bonferroni)."""
    return max(1, math.ceil(min(planned, reference_episodes) / look_every))


def paired_stop(reference: str, planned: int, look_every: int, margin: float) \
        -> tuple[Callable[[list[bool]], str | None], int]:
    """An evaluation's early stop against `reference` (the champion's outcomes), and how many paired tests it plans
    (the gate's final one included)."""
    return (lambda outcomes: early_decision(outcomes, reference, planned, look_every, margin),
            planned_looks(planned, len(reference), look_every))


def early_decision(outcomes: list[bool], reference: str, planned: int, look_every: int, margin: float = 0.05,
                   alpha: float = 0.05) -> str | None:
    """At a look after `len(outcomes)` episodes (numbered 0..k-1) of a run planned for `planned`: the paired
    decision against `reference` ('1'/'0' per numbered episode) if it is already certain, else None.

    Each of the planned looks tests at alpha / looks (Bonferroni), and so does the gate's final test of a run
    that did not stop (`EvalSummary.looks`), so looking keeps the overall error at most alpha, for "not worse" and
    "worse" alike. (The gate at full alpha after looks at alpha / looks was not: simulated at the margin, a challenger
    exactly `margin` worse was promoted 7.5-12.5% of the time at alpha 0.05; tests/unit/registry/test_sequential.py.)"""
    from statistics import NormalDist

    looks = planned_looks(planned, len(reference), look_every)
    z = NormalDist().inv_cdf(1 - alpha / looks)
    r = paired_difference(dict(enumerate(outcomes)), {i: c == "1" for i, c in enumerate(reference)}, margin, z=z)
    if r["decision"] == "undecided":
        return None
    return (f"stopped after {r['episodes']} of {planned} episodes: paired with the champion, {r['decision']} "
            f"(diff {r['diff']:+.3f}, bound {r['ci_low' if r['decision'] == 'not_worse' else 'ci_high']:+.3f} "
            f"at alpha {alpha}/{looks} looks)").replace("not_worse", "not worse")
