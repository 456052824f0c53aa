"""The champion's evaluation as the reference an early-stopping evaluation pairs with: its outcomes per numbered
episode, nominal and under each perturbation, when it was evaluated as the challenger is (same task, seed and
execution settings). `recipe` is an EvalRecipe (the registry does not import the evaluation)."""

from __future__ import annotations

from typing import Any, NamedTuple

from roboloop.registry import Registry, RegistryError


def _champion_eval(name: str, recipe: Any, registry: str | None = None) -> dict:
    """The champion's evaluation record when it was evaluated as `recipe` would be (same task, seed and execution
    settings), else {}."""
    try:
        ev = Registry(registry).lineage(name, "champion").get("eval") or {}
    except RegistryError:  # no champion yet, or an unusable one
        return {}
    same = ev.get("task") == recipe.task and ev.get("seed") == recipe.seed and \
        ev.get("execute_steps") == recipe.execute_steps
    return ev if same else {}


def _perturbed(ev: dict) -> dict[str, dict[str, str]]:
    cells = ev.get("perturbations") or {}
    return {f: {lv: c["outcomes"] for lv, c in levels.items() if c.get("outcomes")} for f, levels in cells.items()}


class References(NamedTuple):
    """The champion's outcomes ('1'/'0' per numbered episode) an early-stopping evaluation pairs with."""
    nominal: str | None = None
    perturbed: dict[str, dict[str, str]] | None = None  # factor -> level -> outcomes
    latency_p99: str | None = None  # its run at its own measured p99 latency


def _latency_p99(ev: dict) -> str | None:
    row = next((r for r in ev.get("latency") or [] if r.get("setting") == "measured p99"), None)
    return (row or {}).get("outcomes") or None


def early_stop_references(name: str, recipe: Any, registry: str | None = None) -> References:
    """What an early-stopping evaluation of `recipe` against `name`'s champion pairs with (one read of its record):
    the champion's nominal outcomes, its outcomes under each perturbation where the gate checks them
    (`gate_robustness`), and at its measured p99 latency where the gate checks that (`gate_latency`)."""
    ev = _champion_eval(name, recipe, registry)
    perturbed = _perturbed(ev) if recipe.perturb and recipe.gate_robustness is not None else {}
    return References(ev.get("outcomes"), perturbed or None, _latency_p99(ev) if recipe.gate_latency else None)
