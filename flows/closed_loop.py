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

from flows import run_name
from roboloop.evaluation.config import CollectConfig
from roboloop.lineage import Lineage
from roboloop.loop import PRESETS, LoopConfig, ci, demo, nightly_gpu  # noqa: F401  (presets, re-exported)
from roboloop.receipts import DatasetRef, Decision, EvalSummary, ExecutionSettings, ModelRef, OfflineSummary
from roboloop.summary import LoopSummary, RoundResult
from tasks.dagger import aggregate_task, dagger_collect_task, rounds_artifact
from tasks.data import convert_task, ingest_task
from tasks.evaluate import evaluate_offline_task, evaluate_task
from tasks.register import register_task
from tasks.rl import register_rl_task, rl_task
from tasks.train import train_task


@flow(name="closed-loop", log_prints=True,
      flow_run_name=run_name("closed-loop {model} from {source} ({evaluation})", model="cfg.model_name",
                             source="cfg.source", evaluation="cfg.evaluation"))
def closed_loop(cfg: LoopConfig = demo()) -> LoopSummary:  # noqa: B008 (the UI form's defaults)
    execution = ExecutionSettings(execute_steps=cfg.eval.execute_steps or ExecutionSettings().execute_steps)
    raw = ingest_task(cfg.source, cfg.collect_if_missing, track=cfg.track)
    data = convert_task(raw, cfg.convert, track=cfg.track)
    model = train_task(data, cfg.train, cfg.launch, track=cfg.track, execution=execution)
    if cfg.evaluation == "offline":
        offline = evaluate_offline_task(model, data, cfg.offline)
        decision = register_task(model, _lineage(cfg, raw, data, model, None, None, offline=offline), cfg.model_name,
                                 margin=cfg.margin)
        return report(data.md5, data.path, model, None, None, decision, offline=offline)
    evaluation = evaluate_task(model, cfg.eval, cfg.model_name, cfg.margin)
    baseline = evaluate_task("random", cfg.eval.model_copy(update={
        "videos": 1, "episodes": min(cfg.eval.episodes, cfg.baseline_episodes or cfg.eval.episodes),
        "early_stop": False})) \
        if cfg.baseline else None
    decision = register_task(model, _lineage(cfg, raw, data, model, evaluation, baseline), cfg.model_name,
                             margin=cfg.margin)
    rounds = [_round(0, data, model, evaluation, decision)]
    for r in range(1, cfg.rounds):
        visited = dagger_collect_task(model, _dagger_recipe(cfg), r, track=cfg.track)
        raw = aggregate_task([raw, visited], r, track=cfg.track)
        data = convert_task(raw, cfg.convert, track=cfg.track)
        recipe = cfg.train.model_copy(update={"init_from": model.path, "steps": cfg.dagger.steps,
                                              "lr": cfg.dagger.lr, "warmup_steps": 0})
        parent = decision
        model = train_task(data, recipe, cfg.launch, track=cfg.track, execution=execution)
        evaluation = evaluate_task(model, cfg.eval, cfg.model_name, cfg.margin)
        decision = register_task(model, _lineage(cfg, raw, data, model, evaluation, baseline, r, parent),
                                 cfg.model_name, margin=cfg.margin)
        rounds.append(_round(r, data, model, evaluation, decision, "dagger"))
    if cfg.rl is not None:
        parent = model.model_copy(update={"registry": decision.registry, "name": decision.name,
                                          "version": decision.version})
        model = rl_task(parent, cfg.rl, track=cfg.track)
        evaluation = evaluate_task(model, cfg.eval.model_copy(update={"execute_steps": cfg.rl.execute_steps}),
                                   cfg.model_name, cfg.margin)
        decision = register_rl_task(model, parent, evaluation, cfg.rl, cfg.model_name, cfg.margin)
        rounds.append(_round(len(rounds), data, model, evaluation, decision, "rl"))
    if len(rounds) > 1:
        rounds_artifact(rounds, str(Path(evaluation.run_dir)))
    return report(data.md5, data.path, model, evaluation, baseline, decision, rounds)


def _dagger_recipe(cfg: LoopConfig) -> CollectConfig:
    base = cfg.collect_if_missing or CollectConfig()
    return CollectConfig(task=cfg.eval.task, episodes=cfg.dagger.episodes, num_envs=cfg.dagger.num_envs,
                         device=cfg.eval.device, seed=base.seed, camera=base.camera,  # the same features to merge
                         execute_steps=cfg.eval.execute_steps or ExecutionSettings().execute_steps)


def _lineage(cfg: LoopConfig, raw: DatasetRef, data: DatasetRef, model: ModelRef, ev: EvalSummary | None,
             baseline: EvalSummary | None, round_: int = 0, parent: Decision | None = None,
             offline: OfflineSummary | None = None) -> Lineage:
    configs = {"source": cfg.source, "convert": cfg.convert.model_dump(mode="json"), "round": round_,
               "evaluation": cfg.evaluation}
    configs["eval" if ev else "offline"] = (cfg.eval if ev else cfg.offline).model_dump(mode="json")
    if round_:
        configs["dagger"] = cfg.dagger.model_dump(mode="json")
    parents = [f"{parent.name}@v{parent.version}"] if parent else []
    return Lineage.of(raw, data, model, ev, baseline=baseline, configs=configs, parents=parents, offline=offline)


def _round(r: int, data: DatasetRef, model: ModelRef, ev: EvalSummary, d: Decision,
           kind: str = "demonstrations") -> RoundResult:
    return RoundResult(round=r, kind=kind, dataset_md5=data.md5, episodes=data.num_episodes, model=model.path,
                       weights_sha256=model.weights_sha256, success_rate=ev.success_rate, ci_low=ev.ci_low,
                       ci_high=ev.ci_high, successes=ev.successes, evaluated=ev.episodes, version=d.version,
                       promoted=d.promoted)


def report(dataset_md5: str, dataset: str, model: ModelRef, ev: EvalSummary | None, baseline: EvalSummary | None,
           decision: Decision, rounds: list[RoundResult] | None = None,
           offline: OfflineSummary | None = None) -> LoopSummary:
    s = LoopSummary(dataset_v3=dataset, dataset_md5=dataset_md5, model=model.path, model_md5=model.md5,
                    weights_sha256=model.weights_sha256, final_loss=model.metrics.get("final_loss"),
                    success_rate=ev.success_rate if ev else None, ci=(ev.ci_low, ev.ci_high) if ev else None,
                    eval_run=ev.run_dir if ev else offline.run_dir if offline else "",
                    random_success_rate=baseline.success_rate if baseline else None, decision=decision,
                    rounds=rounds or [], offline=offline)
    create_markdown_artifact(s.markdown(), key="closed-loop-report", description="closed loop summary")
    return s
