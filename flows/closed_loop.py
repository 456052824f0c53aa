"""The closed loop: ingest -> validate -> convert -> train -> evaluate -> register.

Stages pass receipts (typed records of what they produced) along; each is cached on its inputs'
content identities + config + code version, verified before reuse, so a rerun with unchanged
inputs finishes in seconds and a changed dataset or config reruns exactly what depends on it.
"""

from __future__ import annotations

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from roboloop.lineage import Lineage
from roboloop.loop import PRESETS, LoopConfig, ci, demo, nightly_gpu  # noqa: F401  (presets, re-exported)
from roboloop.receipts import Decision, EvalSummary, ExecutionSettings, ModelRef
from roboloop.summary import LoopSummary
from tasks.data import convert_task, ingest_task
from tasks.evaluate import evaluate_task
from tasks.register import register_task
from tasks.train import train_task


@flow(name="closed-loop", log_prints=True)
def closed_loop(cfg: LoopConfig = LoopConfig()) -> LoopSummary:
    raw = ingest_task(cfg.source, cfg.collect_if_missing, track=cfg.track)
    data = convert_task(raw, cfg.convert, track=cfg.track)
    model = train_task(data, cfg.train, cfg.launch, track=cfg.track,
                       execution=ExecutionSettings(execute_steps=cfg.eval.execute_steps))
    evaluation = evaluate_task(model, cfg.eval)
    baseline = evaluate_task("random", cfg.eval.model_copy(update={"videos": 1})) if cfg.baseline else None
    lineage = Lineage.of(raw, data, model, evaluation, baseline=baseline, configs={
        "source": cfg.source, "convert": cfg.convert.model_dump(mode="json"), "eval": cfg.eval.model_dump(mode="json")})
    decision = register_task(model, lineage, cfg.model_name, margin=cfg.margin)
    return report(data.md5, data.path, model, evaluation, baseline, decision)


def report(dataset_md5: str, dataset: str, model: ModelRef, ev: EvalSummary, baseline: EvalSummary | None,
           decision: Decision) -> LoopSummary:
    s = LoopSummary(dataset_v3=dataset, dataset_md5=dataset_md5, model=model.path, model_md5=model.md5,
                    weights_sha256=model.weights_sha256, final_loss=model.metrics.get("final_loss"),
                    success_rate=ev.success_rate, ci=(ev.ci_low, ev.ci_high), eval_run=ev.run_dir,
                    random_success_rate=baseline.success_rate if baseline else None, decision=decision)
    create_markdown_artifact(s.markdown(), key="closed-loop-report", description="closed loop summary")
    return s
