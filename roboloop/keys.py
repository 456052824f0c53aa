"""Which config fields are part of a stage's cache key, declared on each config model (one place).

A field either shapes the output (`KEYED`: a changed value must recompute) or only changes how fast, how
often or where progress is kept (`NOT_KEYED`: workers, checkpoint cadence, resume). Every field of a
keyed config is in exactly one of them; `tests/unit/test_cache_keys.py` fails on a new field that is in
neither, so a new operational field never silently splits the cache and a new knob never silently hits it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def keyed(cfg: BaseModel) -> dict[str, Any]:
    """The fields of `cfg` that belong in a cache key (a config that knows which of its settings apply says so with
    `keyed_fields()`: a setting nothing reads is left out, so it neither splits nor hits the cache)."""
    if callable(getattr(cfg, "keyed_fields", None)):
        return cfg.model_dump(include=cfg.keyed_fields())  # type: ignore[attr-defined]
    return cfg.model_dump(exclude=set(getattr(type(cfg), "NOT_KEYED", ())))


def undeclared(cls: type[BaseModel]) -> list[str]:
    """Fields of `cls` in neither KEYED nor NOT_KEYED, or in both (what the test reports)."""
    k, n = set(getattr(cls, "KEYED", ())), set(getattr(cls, "NOT_KEYED", ()))
    fields = set(cls.model_fields)
    return sorted((fields - k - n) | (k & n) | ((k | n) - fields))
