"""The closed loop: ingest -> validate -> convert -> train -> evaluate -> register, then DAgger rounds.

Its form: a preset (the deployment names one), the settings people change (source, policy, steps, episodes, margin,
evaluation), then `overrides` (JSON merged into the preset) and `cfg` (the whole config instead of a preset), both
empty unless someone needs them (roboloop/loop_form.py settles them into one LoopConfig).

Stages pass receipts (typed records of what they produced) along; each is cached on its inputs'
content identities + config + code version, verified before reuse, so a rerun with unchanged
inputs finishes in seconds and a changed dataset or config reruns exactly what depends on it.

With `evaluation: offline` (recordings with no simulator twin) the model is scored on the episodes
its training held out, and the promotion gate pairs it with the champion over those episodes.

With `rounds` > 1 the loop closes: the policy acts, the scripted expert labels the states it
visited, the labels join the data as a new dataset version, training continues from the
previous weights, and the result is evaluated and put through the promotion gate again.

With `rl` set, the last model is then fine-tuned with RL in the simulator (Ray workers, see
`flows/rl_finetune.py`), evaluated, and registered as a child of its version through the same gate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows import finish, rename, run_name, short
from roboloop.loop import (  # noqa: F401  (presets, re-exported)
    PRESETS,
    LoopConfig,
    ci,
    cluster,
    demo,
    nightly_gpu,
    run_loop,
)
from roboloop.loop.form import Preset, settle
from roboloop.loop.summary import LoopSummary
from tasks.dagger import rounds_artifact
from tasks.loop import PrefectSteps


@flow(name="closed-loop", log_prints=True,
      flow_run_name=run_name("closed-loop {what} from {source}", what="cfg.model_name|preset",
                             source="source|cfg.source"))
def closed_loop(preset: Preset | None = None, source: str | None = None, policy: str | None = None,
                steps: int | None = None, episodes: int | None = None, margin: float | None = None,
                evaluation: Literal["simulator", "offline"] | None = None, overrides: dict | None = None,
                cfg: LoopConfig | None = None) -> LoopSummary:
    """The closed loop from a preset and the settings people change; the rest through `overrides` or `cfg`.

    Args:
        preset: the recipe to start from (demo when neither it nor cfg is given): demo, ci, vision, nightly_gpu,
            so101, so101_ci or cluster (roboloop/loop.py)
        source: a dataset to run on instead of the preset's (a folder or s3://...), never recorded into
        policy: vla (roboloop's) or one of LeRobot's policies, e.g. act or diffusion
        steps: training steps
        episodes: evaluation episodes (simulator evaluation)
        margin: the promotion gate's non-inferiority margin on the success rate
        evaluation: simulator, or offline (held-out episodes of data with no simulator twin)
        overrides: any other setting, as JSON merged into the preset, e.g. {"train": {"lr": 0.001}}
        cfg: advanced: the whole loop config instead of a preset
    """
    cfg = settle(preset=preset, cfg=cfg, overrides=overrides, source=source, policy=policy, steps=steps,
                 episodes=episodes, margin=margin, evaluation=evaluation)
    rename(f"closed-loop {cfg.model_name} from {short(cfg.source)} ({cfg.evaluation})")
    s = run_loop(cfg, PrefectSteps())  # roboloop.loop.run: the loop, written once; each stage a task run
    if len(s.rounds) > 1:
        rounds_artifact(s.rounds, str(Path(s.eval_run)))
    create_markdown_artifact(s.markdown(), key="closed-loop-report", description="closed loop summary")
    return finish(s, s.message())  # type: ignore[return-value]
