"""The closed loop as a person sets it: a preset, the few settings people change, and the rest as overrides or a whole
config. What the `closed-loop` deployments' form takes (flows/closed_loop.py) and what `roboloop loop --preset
--override` takes (roboloop/cli/loop.py).

    settle(preset=, cfg=, overrides=, source=, policy=, steps=, episodes=, margin=, evaluation=) -> LoopConfig
    override(cfg, over) -> LoopConfig        `over` (a JSON object) merged into `cfg`, every name checked

A setting that would do nothing is refused with the reason (a preset beside a whole config; episodes when the
evaluation is offline).
"""

from __future__ import annotations

import sys
from typing import Any, Literal

from roboloop.loop.config import LoopConfig
from roboloop.loop.presets import PRESETS

Preset = Literal["demo", "ci", "vision", "nightly_gpu", "so101", "so101_ci", "cluster"]


def settle(preset: str | None = None, cfg: LoopConfig | dict | None = None, overrides: dict | None = None,
           source: str | None = None, policy: str | None = None, steps: int | None = None,
           episodes: int | None = None, margin: float | None = None,
           evaluation: Literal["simulator", "offline"] | None = None) -> LoopConfig:
    """The loop's config: `cfg` (the whole config) or the preset (demo when neither is given), `overrides` merged
    into it, then the top-level settings: `source` (a dataset to run on, never recorded into), `policy` (vla or one
    of LeRobot's, e.g. act: the preset's VLA-only settings go back to their defaults), `steps` (training),
    `episodes` (evaluation), `margin` (the gate's), `evaluation` (simulator or offline)."""
    if cfg is not None and preset is not None:
        raise ValueError(f"preset {preset!r} would do nothing: cfg gives the whole config (give one of them)")
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: choose one of {', '.join(sorted(PRESETS))}")
    base = LoopConfig.model_validate(cfg) if cfg is not None else PRESETS[preset or "demo"]()
    if overrides:
        base = override(base, overrides)
    if episodes is not None and (evaluation or base.evaluation) == "offline":
        raise ValueError("episodes would do nothing: an offline evaluation scores the episodes training held out "
                         "(train.val_fraction)")
    over = _top_level(source, policy, steps, episodes, margin, evaluation)
    return override(base, over) if over else base


def _top_level(source, policy, steps, episodes, margin, evaluation) -> dict[str, Any]:
    """The form's top-level settings as an override of the loop's config."""
    over: dict[str, Any] = {}
    train: dict[str, Any] = {}
    if source:
        over.update(source=source, collect_if_missing=None)
    if policy:
        from roboloop.policies import policy_choice

        train.update(policy_choice(policy))
    if steps is not None:
        train["steps"] = steps
    if train:
        over["train"] = train
    if evaluation is not None:
        over["evaluation"] = evaluation
    if episodes is not None:
        over["eval"] = {"episodes": episodes}
    if margin is not None:
        over["margin"] = margin
    return over


def override(cfg: LoopConfig, over: dict) -> LoopConfig:
    """`cfg` with `over` merged into it (objects merge key by key, anything else replaces); a name the config does
    not have is refused, naming its path (pydantic would drop it silently)."""
    if not isinstance(over, dict):
        raise ValueError("overrides take a JSON object, e.g. {\"train\": {\"steps\": 500}}")

    def merge(base, new):
        if isinstance(base, dict) and isinstance(new, dict):
            return {**base, **{k: merge(base.get(k), v) for k, v in new.items()}}
        return new

    merged = LoopConfig.model_validate(_without_unread(cfg, merge(cfg.model_dump(mode="json"), over), over))
    dumped = merged.model_dump(mode="json")

    def check(node, new, path):
        for k, v in new.items():
            if not isinstance(node, dict) or k not in node:
                raise ValueError(f"override: {'.'.join([*path, k])} is not a setting of the loop")
            if isinstance(v, dict):
                check(node[k], v, [*path, k])

    check(dumped, over, [])
    return merged


def _without_unread(cfg: LoopConfig, data: dict, over: dict) -> dict:
    """The merged settings with the preset's train settings that the chosen family does not read set back to their
    defaults (said on stderr); those the override names stay, and validation refuses them."""
    from roboloop.training.config import TrainRecipe

    if not isinstance(data.get("train"), dict):
        return data
    given = set(over["train"]) if isinstance(over.get("train"), dict) else set()
    data["train"], reset = TrainRecipe.without_unread(data["train"], given)
    for name in reset:
        sys.stderr.write(f"roboloop loop: train.{name} {cfg.train.model_dump(mode='json')[name]!r} from the preset "
                         "does not apply to this family: left at its default\n")
    return data
