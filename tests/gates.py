"""What the promotion gate must have decided, recomputed from the numbers the registry holds: a test that runs the
loop asserts the decision it reported is the rule applied to those numbers (not merely that a decision exists)."""

from __future__ import annotations

from pathlib import Path


def expected_decision(registry: str | Path, name: str, version: int, margin: float = 0.05,
                      alpha: float = 0.05) -> tuple[bool, str]:
    """(promoted, reason) for `version` by the gate's rule, against the champion it met (its decision record)."""
    from roboloop.registry import Registry, _first_gate, _gate

    reg = Registry(registry)
    record = [d for d in reg.aliases(name)[0]["decisions"] if d["version"] == version][-1]
    ev, champion = reg._eval(name, version), record["champion_before"]
    return _first_gate(ev, alpha) if champion is None else _gate(ev, reg._eval(name, int(champion)), margin, alpha)
