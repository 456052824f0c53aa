"""The closed loop: its configuration (`config`: one model), named presets as functions (`presets`), the loop
itself written once (`run`: ingest -> convert -> train -> evaluate (simulator or offline) -> register, then DAgger
rounds and an RL round), the UI's form and overrides (`form`) and what it reports (`summary`).

`run_loop(cfg, steps)` takes the stage calls as `steps`: `LocalSteps` (the library's stages, what `roboloop loop`
uses) or the Prefect task adapters (`tasks.loop.PrefectSteps`, what the `closed-loop` flow uses, so each stage is a
task run in the UI). Inside roboloop, import from the submodules; this package's names are for its users.
"""

from roboloop.loop.config import DaggerConfig, LoopConfig, SelectRecipe
from roboloop.loop.presets import PRESETS, ci, cluster, demo, for_source, nightly_gpu, so101, so101_ci, vision
from roboloop.loop.run import LocalSteps, Steps, run_loop

__all__ = ["PRESETS", "DaggerConfig", "LocalSteps", "LoopConfig", "SelectRecipe", "Steps", "ci", "cluster", "demo",
           "for_source", "nightly_gpu", "run_loop", "so101", "so101_ci", "vision"]
