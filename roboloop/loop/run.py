"""The closed loop, written once: `run_loop(cfg, steps) -> LoopSummary`.

    ingest -> convert -> train [-> pick a checkpoint on validation episodes] -> evaluate (simulator, with the
    random baseline; or offline) -> register
    then, with `rounds` > 1, DAgger rounds: the policy acts, the expert labels what it visited, the labels join
    the data as a new version, training continues from the previous weights, evaluate, register;
    then, with `rl`, an RL round: the last model fine-tuned in the simulator, evaluated, registered as a child.

`steps` supplies the stage calls (`Steps`). `LocalSteps` calls the library's stages directly with the receipt
cache (`roboloop loop`, benches); the `closed-loop` flow passes Prefect task adapters (`tasks.loop`), so each
stage shows as a task run with its artifacts. Either way the receipts, caches and registry entries are the
same, so a loop run by one is a verified cache hit for the other.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from roboloop.datasets import layout
from roboloop.datasets.config import ConvertConfig
from roboloop.datasets.meta import load_info
from roboloop.evaluation.config import CollectConfig, EvalRecipe, OfflineRecipe, task_spec
from roboloop.lineage import Lineage
from roboloop.loop.config import LoopConfig
from roboloop.loop.summary import Candidate, LoopSummary, RoundResult, Selection, training_line
from roboloop.receipts import DatasetRef, Decision, EvalSummary, ExecutionSettings, ModelRef, OfflineSummary
from roboloop.rl.config import RLRecipe
from roboloop.serving.check import ServeCheckRecipe, ServedCheck
from roboloop.training.config import LaunchConfig, TrainRecipe


class Steps(Protocol):
    """The stage calls the loop makes; each returns the stage's receipt (see `roboloop.stages`)."""

    def ingest(self, source: str, collect: CollectConfig | None, track: bool) -> DatasetRef: ...
    def convert(self, raw: DatasetRef, cfg: ConvertConfig, track: bool) -> DatasetRef: ...
    def train(self, data: DatasetRef, recipe: TrainRecipe, launch: LaunchConfig | None, track: bool,
              execution: ExecutionSettings) -> ModelRef: ...
    def evaluate(self, policy: str | ModelRef, recipe: EvalRecipe, against: str | None = None,
                 margin: float = 0.05) -> EvalSummary: ...
    def evaluate_offline(self, model: ModelRef, data: DatasetRef, recipe: OfflineRecipe) -> OfflineSummary: ...
    def register(self, model: ModelRef, lineage: Lineage, name: str, margin: float) -> Decision: ...
    def dagger_collect(self, model: ModelRef, recipe: CollectConfig, round_: int, track: bool) -> DatasetRef: ...
    def aggregate(self, sources: list[DatasetRef], round_: int, track: bool) -> DatasetRef: ...
    def rl(self, parent: ModelRef, recipe: RLRecipe, track: bool) -> ModelRef: ...
    def candidates(self, model: ModelRef, track: bool) -> list[tuple[int, ModelRef]]: ...
    def serve_check(self, decision: Decision, recipe: EvalRecipe, reference: EvalSummary,
                    cfg: ServeCheckRecipe) -> ServedCheck: ...


class LocalSteps:
    """The library's stages, in this process (children for training, simulation and RL, as always), with the
    receipt cache; no Prefect. `on_line` gets the children's progress lines."""

    def __init__(self, on_line: Callable[[str], None] = print, cache=None):
        from roboloop.cache import ReceiptCache

        self.on_line, self.cache = on_line, cache or ReceiptCache()

    def ingest(self, source, collect, track):
        from roboloop import stages

        return stages.ingest(source, collect=collect, track=track, on_line=self.on_line)

    def convert(self, raw, cfg, track):
        from roboloop import stages

        return stages.convert(raw, cfg, cache=self.cache, track=track)

    def train(self, data, recipe, launch, track, execution):
        from roboloop import stages

        return stages.train(data, recipe, launch, cache=self.cache, track=track, execution=execution,
                            on_line=self.on_line)

    def evaluate(self, policy, recipe, against=None, margin=0.05):
        from roboloop import stages

        return stages.evaluate(policy, recipe, cache=self.cache, on_line=self.on_line, against=against, margin=margin)

    def evaluate_offline(self, model, data, recipe):
        from roboloop import stages

        return stages.evaluate_offline(model, data, recipe, cache=self.cache)

    def register(self, model, lineage, name, margin):
        from roboloop import stages

        return stages.register(model, lineage, name, margin=margin)

    def dagger_collect(self, model, recipe, round_, track):
        from roboloop import stages

        return stages.dagger_collect(model, recipe, round_, cache=self.cache, track=track, on_line=self.on_line)

    def aggregate(self, sources, round_, track):
        from roboloop import stages

        return stages.aggregate(sources, cache=self.cache, track=track)

    def rl(self, parent, recipe, track):
        from roboloop import stages

        return stages.rl_finetune(parent, recipe, cache=self.cache, on_line=self.on_line, track=track)

    def candidates(self, model, track):
        return candidates(model, track, self.cache)

    def serve_check(self, decision, recipe, reference, cfg):
        from roboloop.serving.check import served_check

        return served_check(decision, recipe, reference, cfg, on_line=self.on_line)


def candidates(model: ModelRef, track: bool, cache=None) -> list[tuple[int, ModelRef]]:
    """(step, model) for `model`'s kept checkpoints (exported as model folders, DVC-tracked with `track`: the loop
    may carry one on and register it), then `model` itself. Cached on the run's weights: a run restored from DVC
    has no checkpoints/, and its exports come back from DVC instead (checked, as every cache hit is)."""
    from roboloop import stages
    from roboloop.cache import cache_key
    from roboloop.receipts import Checkpoints
    from roboloop.training.kept import kept_checkpoints

    key = cache_key("checkpoints", model.weights_sha256, track)
    kept = kept_checkpoints(model.path)
    hit = cache.get(key, Checkpoints) if cache is not None and not kept else None
    if hit is None:
        found = [(step, stages.model_ref(m.path, model.dataset_md5, model.execution, track=track))
                 for step, m in (stages.sweep_candidates(model.path, include_final=False) if kept else [])]
        hit = Checkpoints(run_weights_sha256=model.weights_sha256, steps=[s for s, _ in found],
                          models=[m for _, m in found])
        if cache is not None:
            cache.put(key, hit)
    final = int(model.config.get("steps") or model.metrics.get("steps") or 0)
    return [*zip(hit.steps, hit.models, strict=True), (final, model)]


def run_loop(cfg: LoopConfig, steps: Steps) -> LoopSummary:
    """One pass of the closed loop (and its DAgger and RL rounds); returns what it produced."""
    execution = ExecutionSettings(execute_steps=cfg.eval.execute_steps or ExecutionSettings().execute_steps)
    raw = steps.ingest(cfg.source, cfg.collect_if_missing, cfg.track)
    data = steps.convert(raw, cfg.convert, cfg.track)
    model = trained = steps.train(data, cfg.train, cfg.launch, cfg.track, execution)
    model, pick = select(cfg, model, steps, 0)
    picks = [pick] if pick else []
    if cfg.evaluation == "offline":
        offline = steps.evaluate_offline(model, data, cfg.offline)
        decision = steps.register(model, lineage(cfg, raw, data, model, None, None, offline=offline),
                                  cfg.model_name, cfg.margin)
        return summary(data, model, None, None, decision, offline=offline, trained=trained)
    evaluation = steps.evaluate(model, cfg.eval, cfg.model_name, cfg.margin)
    baseline = steps.evaluate("random", baseline_recipe(cfg)) if cfg.baseline else None
    decision = steps.register(model, lineage(cfg, raw, data, model, evaluation, baseline, pick=pick),
                              cfg.model_name, cfg.margin)
    rounds = [round_result(0, data, model, evaluation, decision)]
    for r in range(1, cfg.rounds):
        visited = steps.dagger_collect(model, dagger_recipe(cfg, raw), r, cfg.track)
        raw = steps.aggregate([raw, visited], r, cfg.track)
        data = steps.convert(raw, cfg.convert, cfg.track)
        recipe = cfg.train.model_copy(update={"init_from": model.path, "steps": cfg.dagger.steps,
                                              "lr": cfg.dagger.lr, "warmup_steps": cfg.dagger.warmup_steps})
        parent = decision
        model = trained = steps.train(data, recipe, cfg.launch, cfg.track, execution)
        model, pick = select(cfg, model, steps, r)
        picks += [pick] if pick else []
        evaluation = steps.evaluate(model, cfg.eval, cfg.model_name, cfg.margin)
        decision = steps.register(model, lineage(cfg, raw, data, model, evaluation, baseline, r, parent, pick=pick),
                                  cfg.model_name, cfg.margin)
        rounds.append(round_result(r, data, model, evaluation, decision, "dagger"))
    if cfg.rl is not None:
        parent_model = model.model_copy(update={"registry": decision.registry, "name": decision.name,
                                                "version": decision.version})
        model = trained = steps.rl(parent_model, cfg.rl, cfg.track)
        evaluation = steps.evaluate(model, cfg.eval.model_copy(update={"execute_steps": cfg.rl.execute_steps}),
                                    cfg.model_name, cfg.margin)
        decision = steps.register(model, rl_lineage(model, parent_model, evaluation, cfg.rl), cfg.model_name,
                                  cfg.margin)
        rounds.append(round_result(len(rounds), data, model, evaluation, decision, "rl"))
    # the last version registered, served and driven through its server (the RL round's execute_steps are in
    # `evaluation`'s record)
    served = steps.serve_check(decision, cfg.eval, evaluation, cfg.serve_check) if cfg.serve_check else None
    return summary(data, model, evaluation, baseline, decision, rounds, picks=picks, trained=trained, served=served)


def select(cfg: LoopConfig, model: ModelRef, steps: Steps, round_: int) -> tuple[ModelRef, Selection | None]:
    """`cfg.select`: the training run's kept checkpoints and final model, each on the same validation episodes
    (`select.seed`: not the episodes the loop then reports), and the best of them (ties: the later step)."""
    if cfg.select is None:
        return model, None
    from roboloop.loop.sweep import Scored, best

    found = steps.candidates(model, cfg.track)
    final = max(step for step, _ in found)
    if len(found) < 2:
        return model, Selection(round=round_, seed=cfg.select.seed, episodes=cfg.select.episodes, final_step=final,
                                picked_step=final, picked_model=model.path)
    recipe = cfg.eval.model_copy(update={"seed": cfg.select.seed, "episodes": cfg.select.episodes, "videos": 0,
                                         "early_stop": False})
    scored = []
    for step, m in found:
        e = steps.evaluate(m, recipe)
        scored.append((Scored(step, m.path, e.success_rate, e.ci_low, e.ci_high, e.successes, e.episodes, {}),
                       Candidate(step=step, model=m.path, successes=e.successes, episodes=e.episodes,
                                 success_rate=e.success_rate, ci_low=e.ci_low, ci_high=e.ci_high, eval_run=e.run_dir)))
    top = best([s for s, _ in scored])
    picked = dict(found)[top.step]  # the final step's entry is `model` itself
    return picked, Selection(round=round_, seed=cfg.select.seed, episodes=cfg.select.episodes, final_step=final,
                             picked_step=top.step, picked_model=picked.path, candidates=[c for _, c in scored])


def baseline_recipe(cfg: LoopConfig) -> EvalRecipe:
    """The random policy on the first `baseline_episodes` of the policy's episodes (the same layouts), without
    videos: the gate needs its outcomes, and a scripted policy without videos runs without cameras."""
    return cfg.eval.model_copy(update={"videos": 0, "early_stop": False, "precision": "fp32",  # no network
                                       "episodes": min(cfg.eval.episodes, cfg.baseline_episodes or cfg.eval.episodes)})


def dagger_recipe(cfg: LoopConfig, raw: DatasetRef | None = None) -> CollectConfig:
    """A DAgger round's recording: the loop's task, device and execution, the demonstrations' seed, and the camera
    and environment_state the data it is merged into has (`raw`'s features when they are at hand, else what
    `collect_if_missing` records): the merge refuses datasets whose features differ, and a source recorded
    earlier need not have been recorded with the loop's settings."""
    base = cfg.collect_if_missing or CollectConfig()
    camera, env_state = base.camera, base.environment_state
    if raw is not None and (Path(raw.path) / layout.INFO_PATH).is_file():
        features = load_info(Path(raw.path)).features
        camera = any(f.is_visual for f in features.values())
        env_state = "observation.environment_state" in features
    return CollectConfig(task=cfg.eval.task, episodes=cfg.dagger.episodes, num_envs=cfg.dagger.num_envs,
                         device=cfg.eval.device, seed=base.seed, camera=camera,
                         environment_state=env_state and task_spec(cfg.eval.task).env_state_names is not None,
                         execute_steps=cfg.eval.execute_steps or ExecutionSettings().execute_steps)


def lineage(cfg: LoopConfig, raw: DatasetRef, data: DatasetRef, model: ModelRef, ev: EvalSummary | None,
            baseline: EvalSummary | None, round_: int = 0, parent: Decision | None = None,
            offline: OfflineSummary | None = None, pick: Selection | None = None) -> Lineage:
    configs = {"source": cfg.source, "convert": cfg.convert.model_dump(mode="json"), "round": round_,
               "evaluation": cfg.evaluation}
    if pick is not None:
        configs["select"] = pick.model_dump(mode="json")
    configs["eval" if ev else "offline"] = (cfg.eval if ev else cfg.offline).model_dump(mode="json")
    if round_:
        configs["dagger"] = cfg.dagger.model_dump(mode="json")
    parents = [f"{parent.name}@v{parent.version}"] if parent else []
    return Lineage.of(raw, data, model, ev, baseline=baseline, configs=configs, parents=parents, offline=offline)


def rl_lineage(model: ModelRef, parent: ModelRef, ev: EvalSummary, recipe: RLRecipe) -> Lineage:
    """An RL model's lineage: its parent version (or folder) and the dataset the parent was cloned on."""
    from roboloop import stages

    parents = [f"{parent.name}@v{parent.version}"] if parent.version else [parent.path]
    return Lineage.of(None, stages.parent_dataset(parent), model, ev, parents=parents,
                      configs={"rl": recipe.model_dump(mode="json"), "parent_weights": parent.weights_sha256})


def round_result(r: int, data: DatasetRef, model: ModelRef, ev: EvalSummary, d: Decision,
                 kind: str = "demonstrations") -> RoundResult:
    return RoundResult(round=r, kind=kind, dataset_md5=data.md5, episodes=data.num_episodes, model=model.path,
                       weights_sha256=model.weights_sha256, success_rate=ev.success_rate, ci_low=ev.ci_low,
                       ci_high=ev.ci_high, successes=ev.successes, evaluated=ev.episodes, version=d.version,
                       promoted=d.promoted)


def summary(data: DatasetRef, model: ModelRef, ev: EvalSummary | None, baseline: EvalSummary | None,
            decision: Decision, rounds: list[RoundResult] | None = None,
            offline: OfflineSummary | None = None, picks: list[Selection] | None = None,
            trained: ModelRef | None = None, served: ServedCheck | None = None) -> LoopSummary:
    """`model` is what the loop carried on; `trained` the last training run (its loss and wall clock), which is
    `model` unless a checkpoint of it was picked."""
    run = trained or model
    return LoopSummary(dataset_v3=data.path, dataset_md5=data.md5, model=model.path, model_md5=model.md5,
                       weights_sha256=model.weights_sha256, final_loss=run.metrics.get("final_loss"),
                       success_rate=ev.success_rate if ev else None, ci=(ev.ci_low, ev.ci_high) if ev else None,
                       eval_run=ev.run_dir if ev else offline.run_dir if offline else "",
                       random_success_rate=baseline.success_rate if baseline else None, decision=decision,
                       rounds=rounds or [], offline=offline,
                       training=training_line(run.metrics), selections=picks or [], served=served)


