"""The champion's evaluation as the reference an early-stopping evaluation pairs with: its outcomes per numbered
episode, nominal and under each perturbation, when it was evaluated as the challenger is (same task, seed and
execution settings). `recipe` is an EvalRecipe (the registry does not import the evaluation)."""

from __future__ import annotations

from typing import Any

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


def early_stop_references(name: str, recipe: Any, registry: str | None = None) \
        -> tuple[str | None, dict[str, dict[str, str]] | None]:
    """What an early-stopping evaluation of `recipe` against `name`'s champion pairs with (one read of its record):
    the champion's nominal outcomes ('1'/'0' per numbered episode), and its outcomes under each perturbation (factor
    -> level -> outcomes) where the gate checks them (`gate_robustness`)."""
    ev = _champion_eval(name, recipe, registry)
    perturbed = _perturbed(ev) if recipe.perturb and recipe.gate_robustness is not None else {}
    return ev.get("outcomes"), perturbed or None
