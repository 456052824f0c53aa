"""The closed loop: ingest -> validate -> convert -> train -> evaluate -> register, then DAgger rounds.

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

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows import finish, run_name
from roboloop.loop import (  # noqa: F401  (presets, re-exported)
    PRESETS,
    LoopConfig,
    ci,
    cluster,
    demo,
    nightly_gpu,
    run_loop,
)
from roboloop.summary import LoopSummary
from tasks.dagger import rounds_artifact
from tasks.loop import PrefectSteps


@flow(name="closed-loop", log_prints=True,
      flow_run_name=run_name("closed-loop {model} from {source} ({evaluation})", model="cfg.model_name",
                             source="source|cfg.source", evaluation="cfg.evaluation"))
def closed_loop(cfg: LoopConfig = demo(), source: str | None = None) -> LoopSummary:  # noqa: B008 (the UI form's defaults)
    """`source`: a dataset to run on instead of `cfg.source`, never recorded into (what a dataset-arrived trigger
    passes, so the deployment's own `cfg` stays the one it was deployed with)."""
    if source:
        cfg = cfg.model_copy(update={"source": source, "collect_if_missing": None})
    s = run_loop(cfg, PrefectSteps())  # roboloop.loop_run: the loop, written once; each stage a task run
    if len(s.rounds) > 1:
        rounds_artifact(s.rounds, str(Path(s.eval_run)))
    create_markdown_artifact(s.markdown(), key="closed-loop-report", description="closed loop summary")
    return finish(s, s.message())  # type: ignore[return-value]
