"""The promotion gate's checks beyond the nominal episodes, as the challenger's evaluation asked for them
(`EvalRecipe.gate_robustness`, `gate_latency`, recorded in its lineage's `eval.gate`):

- robustness: under every perturbation (factor and level) both versions were evaluated with, on the same episodes,
  the challenger is not worse than the champion by more than the margin (paired, one-sided 1 - alpha each: every
  cell must pass, so a challenger better on nominal episodes but worse under one factor is refused; a cell whose
  run stopped early against the champion's tests at alpha / its looks, as each look did);
- latency: the challenger's success with its own measured p99 latency charged is not worse than the champion's with
  its own (paired, with the nominal margin: a slower model must not lose success to its slowness);
- envelope: the robot's envelope refused the challenger's actions no more often per step than the champion's
  (`EvalRecipe.gate_envelope`, evaluations with `envelope robot`): a model a robot would hold more often is not
  promoted, however well it scores where nothing holds it.

A check the champion's record cannot answer (it was evaluated before the check existed, or under other factors) is
named in the reason as not checked, never passed silently.
"""

from __future__ import annotations

from typing import Any

from roboloop.binomial import paired_gate


def robustness_and_latency(new: dict[str, Any], old: dict[str, Any], same_episodes: bool, margin: float,
                           alpha: float, nominal: str) -> tuple[bool, str]:
    gate = new.get("gate") or {}
    notes = [f"nominal: {nominal}"]
    if not same_episodes:
        return False, "; ".join([*notes, "robustness/latency checks need the same numbered episodes (task, seed, "
                                 "execute_steps) as the champion's: not promoted"])
    robust = gate.get("gate_robustness")
    if robust is not None:
        ok, why = _robustness(new.get("perturbations") or {}, old.get("perturbations") or {}, float(robust), alpha)
        notes.append(why)
        if not ok:
            return False, "; ".join([*notes, "decided by robustness: not promoted"])
    if gate.get("gate_latency"):
        ok, why = _latency(new.get("latency") or [], old.get("latency") or [], margin, alpha)
        notes.append(why)
        if not ok:
            return False, "; ".join([*notes, "decided by latency: not promoted"])
    if gate.get("gate_envelope"):
        ok, why = _envelope(new.get("envelope"), old.get("envelope"))
        notes.append(why)
        if not ok:
            return False, "; ".join([*notes, "decided by the envelope: not promoted"])
    return True, "; ".join(notes)


def _envelope(new: dict | None, old: dict | None) -> tuple[bool, str]:
    def rate(e: dict) -> float:
        return float(e.get("refused") or 0) / max(1, int(e.get("steps") or 0))

    if not new:
        return False, "envelope: the challenger was not evaluated through the robot's envelope"
    if not old:
        return True, "envelope not checked: the champion was not evaluated through the robot's envelope"
    a, b = rate(new), rate(old)
    verdict = "no more often" if a <= b else "more often"
    return a <= b, (f"envelope: the challenger refused {new.get('refused')} of {new.get('steps')} steps, the champion "
                    f"{old.get('refused')} of {old.get('steps')} ({verdict} per step)")


def _robustness(new: dict, old: dict, margin: float, alpha: float) -> tuple[bool, str]:
    cells = [(f, lv) for f, levels in new.items() for lv in levels if lv in (old.get(f) or {})]
    missing = [f"{f}={lv}" for f, levels in new.items() for lv in levels if lv not in (old.get(f) or {})]
    if not cells:
        return True, ("robustness not checked: the champion was evaluated under none of " +
                      ", ".join(missing or ["the challenger's factors"]))
    worst = None
    for f, lv in cells:
        ok, why, spent = _paired_run(new[f][lv], old[f][lv], margin, alpha)
        if not ok:
            return False, f"robustness {f}={lv} (margin {margin}{spent}): {why}"
        diff = new[f][lv]["success_rate"] - old[f][lv]["success_rate"]
        worst = min(worst or (diff, f, lv), (diff, f, lv))
    assert worst is not None
    skipped = f"; not checked (the champion has none): {', '.join(missing)}" if missing else ""
    return True, (f"robustness: not worse under {len(cells)} perturbation(s) (margin {margin}; the closest "
                  f"{worst[1]}={worst[2]}, {worst[0]:+.3f}){skipped}")


def _latency(new: list[dict], old: list[dict], margin: float, alpha: float) -> tuple[bool, str]:
    def p99(rows: list[dict]) -> dict | None:
        return next((r for r in rows if r.get("setting") == "measured p99"), None)

    a, b = p99(new), p99(old)
    if a is None:
        return False, "latency: the challenger was not evaluated at its measured p99 latency"
    if b is None:
        return True, "latency not checked: the champion was not evaluated at its measured p99 latency"
    ok, why, spent = _paired_run(a, b, margin, alpha)
    spent = "" if ok else spent
    return ok, f"latency at each one's measured p99 ({a['ms']:g} vs {b['ms']:g} ms{spent}): {why}"


def _paired_run(new: dict, old: dict, margin: float, alpha: float) -> tuple[bool, str, str]:
    """The paired test of one suite run (a perturbation cell, the p99 latency row) against the champion's: a run that
    looked before its end spends alpha / looks, as each look did. Returns (ok, why, what was spent: '' or ', alpha
    A/L: ...')."""
    looks = new.get("looks") or 1
    ok, why = paired_gate(new["outcomes"], old["outcomes"], margin, alpha / looks)
    spent = f", alpha {alpha:g}/{looks}: its run looked {looks - 1} times before its end" if looks > 1 else ""
    return ok, why, spent
