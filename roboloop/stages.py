"""The loop's stages, written once: each takes receipts and configs and returns a receipt.

    ingest(source)                    -> DatasetRef   validated (any LeRobot version), DVC md5
    convert(raw, convert_config)      -> DatasetRef   v3.0, in artifacts/datasets/<key>
    train(dataset, recipe, launch)    -> ModelRef     under torchrun, in artifacts/models/<key>
    evaluate(policy, eval_recipe)     -> EvalSummary  in its own run folder, artifacts/evals/<run>
    evaluate_offline(model, dataset)  -> OfflineSummary  held-out episodes and two trivial baselines
    register(model, lineage, ...)     -> Decision     a registry version, promoted only through the gate

The loop (`roboloop.loop.run_loop`: `roboloop loop`, the `closed-loop` flow's task adapters, benches),
`roboloop reproduce` and `roboloop registry add` (roboloop/loop/reproduce.py, registry_add.py) call these. With a
`ReceiptCache`, a stage whose inputs (their content identities), config and code are unchanged returns its earlier
receipt, once its output has been checked (or restored from DVC); output folders are named by that key, so a
different input never lands on an earlier output. `roboloop convert`, `ingest`, `train`, `evaluate` are these stages
too (roboloop/cli/stages.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from roboloop import fsutil
from roboloop.binomial import outcomes_by_episode
from roboloop.cache import ReceiptCache, cache_key, convert_key
from roboloop.datasets.config import ConvertConfig
from roboloop.evaluation.config import CollectConfig, EvalConfig, EvalRecipe, OfflineRecipe
from roboloop.hashing import MODEL_IGNORE, acting_digest, dir_md5, file_sha256, remembering
from roboloop.keys import keyed
from roboloop.lineage import Lineage
from roboloop.receipts import DatasetRef, Decision, EvalSummary, ExecutionSettings, ModelRef, OfflineSummary
from roboloop.rl.config import RLRecipe
from roboloop.training.config import LaunchConfig, TrainConfig, TrainRecipe
from roboloop.training.runstore import JoinDoc

OnLine = Callable[[str], None]


def artifacts_root() -> Path:
    from roboloop.settings import settings

    return Path(settings().artifacts)


def slug(text: str, limit: int = 48, keep_end: bool = False) -> str:
    """Lowercase letters, digits and dashes, cut at `limit` (with `keep_end`, in the middle: a `...-step00002000`)."""
    s = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", text.lower())).strip("-")
    if keep_end and len(s) > limit:
        s = f"{s[:limit // 2].rstrip('-')}-{s[len(s) - (limit - limit // 2 - 1):].lstrip('-')}"
    return s[:limit] or "x"


# ---------------------------------------------------------------- data
def trackable_in_place(path: str | Path) -> bool:
    """May `track` DVC-track this folder where it is? Only inside the repository that holds the artifacts (the
    demo's `data/`, tracked by the root's `data.dvc`). A user's folder anywhere else (their disk, a NAS, a
    read-only mount) is never written to: not a `.dvc` file beside it, not a marker in it; the loop versions
    its own copy under artifacts/ instead (see `convert`)."""
    from roboloop import dvc

    root = dvc.find_root(artifacts_root())
    return root is not None and fsutil.inside(Path(path), root)


def dataset_ref(path: str | Path, source: str | None = None, track: bool = False) -> DatasetRef:
    from roboloop import dvc
    from roboloop.datasets.meta import load_meta

    path = Path(path).absolute()
    meta = load_meta(path)
    track = track and trackable_in_place(path)
    md5 = dvc.track(path).md5 if track else dir_md5(path)
    return DatasetRef(path=str(path), md5=md5, format=meta.version, num_episodes=len(meta.episodes),  # type: ignore[arg-type]
                      num_frames=sum(ep.length for ep in meta.episodes), fps=meta.info.fps, source=source,
                      tracked=track)


def ingest(source: str, cache_dir: str | Path | None = None, deep: bool = False, workers: int = 8,
           collect: CollectConfig | None = None, track: bool = False, on_line: OnLine = print) -> DatasetRef:
    """A validated dataset from a folder or S3 (DatasetDefectError otherwise); `collect` records a missing one."""
    from roboloop.datasets.ingest import ingest as ingest_dataset
    from roboloop.s3 import is_s3

    if collect is not None and not is_s3(source) and not (Path(source) / "meta" / "info.json").exists():
        from roboloop.evaluation.run import collect_in_subprocess

        collect_in_subprocess(collect.model_copy(update={"dst": source}), on_line=on_line)
    if cache_dir is None:
        from roboloop.settings import settings

        cache_dir = settings().cache_dir
    result = ingest_dataset(source, cache_dir=cache_dir, strict=True, deep=deep, workers=workers)
    return dataset_ref(result.path, source=str(source), track=track and not is_s3(source))


def convert(raw: DatasetRef, cfg: ConvertConfig, cache: ReceiptCache | None = None, dst: str | Path | None = None,
            track: bool = False, overwrite: bool = False, validated: bool | Future = False) -> DatasetRef:
    """v2.x -> v3.0. A v3.0 dataset is returned as is, unless it is to be tracked and could not be tracked where
    it is (a folder outside the repository, an S3 download): then the loop versions a copy of it under
    artifacts/ (the user's folder is only read). An explicit `dst` (`roboloop convert SRC DST`) takes a cached
    result only if it is that folder; `overwrite` lets another conversion replace an earlier one of roboloop's
    there (moved aside, never deleted). `validated`: `validate_source` passed or runs (see the converter)."""
    from roboloop.datasets.convert import convert as convert_dataset

    if raw.format == "v3.0":
        if not track or raw.tracked:
            return raw
        return snapshot(raw, cache, dst)
    key = convert_key(raw.md5, cfg)
    out = Path(dst).absolute() if dst else artifacts_root() / "datasets" / f"v3-{key.split('-')[-1][:16]}"
    if cache and (hit := cache.get(key, DatasetRef)) and (dst is None or Path(hit.path) == out):
        return dataset_ref(out, source=raw.md5, track=True) if track and not hit.tracked else hit
    ours = (fsutil.read_marker(out) or {}).get("key") == key
    if ours and not (cache and cache.has(key)) and (out / "meta" / "info.json").is_file():
        ref = dataset_ref(out, source=raw.md5, track=track)  # this very conversion, receipt lost: reuse
    else:  # (a conversion of ours whose receipt no longer checks out is redone; the old one is moved aside)
        with remembering():  # the converter hashes its output while checking it: not read twice
            convert_dataset(raw.path, out, cfg.model_copy(update={"progress": False}), overwrite or ours, {"key": key},
                            validated)
            ref = dataset_ref(out, source=raw.md5, track=track)
    if cache:
        cache.put(key, ref)
    return ref


def snapshot(raw: DatasetRef, cache: ReceiptCache | None = None, dst: str | Path | None = None) -> DatasetRef:
    """A DVC-tracked copy of a v3.0 dataset that lives outside the repository, named by its content md5."""
    key = cache_key("snapshot", raw.md5)
    if cache and (hit := cache.get(key, DatasetRef)):
        return hit
    out = Path(dst) if dst else artifacts_root() / "datasets" / f"v3-{key.split('-')[-1][:16]}"
    marker = fsutil.read_marker(out)
    if not (marker and marker.get("key") == key and dir_md5(out, (fsutil.MARKER,)) == raw.md5):
        import shutil

        meta = {"format": "v3.0", "key": key}
        with fsutil.exclusive(fsutil.lock_path_for(out), str(out), wait=True), \
                fsutil.atomic_dir(out, "dataset_v3", overwrite=marker is not None, meta=meta) as tmp:
            src = Path(raw.path)
            for f in sorted(p for p in src.rglob("*") if p.is_file()):  # contents only: a read-only source's
                (tmp / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)  # modes stay behind
                shutil.copyfile(f, tmp / f.relative_to(src))
            if dir_md5(tmp) != raw.md5:
                raise ValueError(f"{raw.path} changed while it was being copied; run again once it is complete")
    ref = dataset_ref(out, source=raw.md5, track=True)
    if cache:
        cache.put(key, ref)
    return ref


def dagger_collect(model: ModelRef, recipe: CollectConfig, round_: int, cache: ReceiptCache | None = None,
                   track: bool = False, on_line: OnLine = print) -> DatasetRef:
    """DAgger: `model` acts for `recipe.episodes` episodes (on train-split layouts of seed `recipe.seed + round_`),
    and every state it visits is recorded with the scripted expert's action there (failures kept)."""
    from roboloop.evaluation.run import collect_in_subprocess

    key = cache_key("dagger", model.weights_sha256, acting_digest(model.path), keyed(recipe), round_)
    if cache and (hit := cache.get(key, DatasetRef)):
        return hit
    out = artifacts_root() / "datasets" / f"dagger-r{round_}-{key.split('-')[-1][:16]}"
    if not (out / "meta" / "info.json").is_file():  # the writer publishes a finished recording only
        collect_in_subprocess(recipe.model_copy(update={"dst": str(out), "policy": model.path,
                                                        "seed": recipe.seed + round_}), on_line=on_line)
    ref = dataset_ref(out, source=f"dagger:{model.weights_sha256}", track=track)
    if cache:
        cache.put(key, ref)
    return ref


def aggregate(sources: list[DatasetRef], cache: ReceiptCache | None = None, track: bool = False) -> DatasetRef:
    """A new dataset version holding every episode of `sources` (v2.x), its marker naming their md5s."""
    from roboloop.datasets.merge import merge_v21

    md5s = [s.md5 for s in sources]
    key = cache_key("aggregate", md5s)
    if cache and (hit := cache.get(key, DatasetRef)):
        return hit
    out = artifacts_root() / "datasets" / f"aggregate-{key.split('-')[-1][:16]}"
    marker = fsutil.read_marker(out)
    if not (marker and marker.get("merged_from") == md5s):
        merge_v21([s.path for s in sources], out, merged_from=md5s)
    ref = dataset_ref(out, source="+".join(md5s), track=track)
    if cache:
        cache.put(key, ref)
    return ref


# ---------------------------------------------------------------- training
def model_ref(path: str | Path, dataset_md5: str, execution: ExecutionSettings | None = None, track: bool = False,
              **registry: object) -> ModelRef:
    from roboloop import dvc
    from roboloop.training.metrics import summary

    path = Path(path).absolute()
    from roboloop.policies import model_info

    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path}: no model.safetensors; not a finished roboloop model")
    info = model_info(path)
    md5 = dvc.track(path).md5 if track else dir_md5(path, MODEL_IGNORE)
    return ModelRef(path=str(path), weights_sha256=file_sha256(path / "model.safetensors"), md5=md5,
                    dataset_md5=dataset_md5, family=info.family, config=info.train, metrics=summary(path),
                    execution=execution or ExecutionSettings(), tracked=track, **registry)  # type: ignore[arg-type]


def train(data: DatasetRef, recipe: TrainRecipe, launch: LaunchConfig | None = None,
          cache: ReceiptCache | None = None, output_dir: str | Path | None = None, track: bool = False,
          execution: ExecutionSettings | None = None, on_line: OnLine = print, overwrite: bool = False,
          in_process: bool = False, nodes: Callable[[JoinDoc], None] | None = None) -> ModelRef:
    """Train on `data` under torchrun (resuming this run's checkpoints; another run's folder is refused), or, one
    rank with `in_process` (`roboloop train`), in this process. An explicit `output_dir` takes a cached result only
    if it is that folder. With `launch.deployment`, `nodes(job)` trains on the pool's nodes (the Prefect train task
    submits one run per node) and the model comes from the run store."""
    from roboloop.training.launch import run_torchrun

    launch = launch or LaunchConfig.from_settings()
    world = launch.nproc_per_node * launch.nnodes
    key = cache_key("train", data.md5, keyed(recipe), world)
    out = Path(output_dir).absolute() if output_dir else \
        artifacts_root() / "models" / f"{recipe.policy_type or recipe.preset}-{key.split('-')[-1][:16]}"
    from roboloop.training.runstore import store_url

    # with a run store, node 0 goes through the launcher even for a finished run: it delivers a model that never
    # reached the store and tells waiting nodes there is nothing to train (a receipt here used to skip both)
    mirrored = store_url() is not None and not launch.deployment
    if cache and not overwrite and not mirrored and (hit := cache.get(key, ModelRef)) and \
            (output_dir is None or Path(hit.path) == out):
        return hit
    if launch.deployment:
        _train_on_nodes(data, recipe, launch, out, key, nodes)
        return _trained(out, data, execution, track, cache, key)
    cfg = TrainConfig.of(recipe, data.path, str(out))
    if in_process and world == 1 and store_url() is None:  # with a run store, the launcher mirrors the run to it
        from roboloop.training.train import train as train_here

        train_here(cfg, overwrite=overwrite)
    else:
        run_torchrun(cfg, launch, on_line=on_line, overwrite=overwrite)
    return _trained(out, data, execution, track, cache, key)


def _trained(out: Path, data: DatasetRef, execution: ExecutionSettings | None, track: bool,
             cache: ReceiptCache | None, key: str) -> ModelRef:
    ref = model_ref(out, data.md5, execution, track)
    if cache:
        cache.put(key, ref)
    return ref


def _train_on_nodes(data: DatasetRef, recipe: TrainRecipe, launch: LaunchConfig, out: Path, key: str,
                    nodes: Callable[[JoinDoc], None] | None) -> None:
    """`launch.deployment`: the job into the run store, its nodes started by `nodes`, the model taken back (a model
    the mirror already holds, from a run whose orchestrator was lost, is taken without training again)."""
    from roboloop.training import remote

    if nodes is None:
        raise ValueError(f"launch.deployment={launch.deployment!r} trains on a Prefect pool's nodes, which only the "
                         "closed-loop flow starts (`roboloop loop` trains here: leave launch.deployment empty)")
    run_id = f"{launch.run_id}-{key.split('-')[-1][:8]}-{secrets.token_hex(3)}"  # each attempt a job of its own
    job = remote.prepare(Path(data.path), recipe, launch, out, run_id=run_id)
    if not remote.take_model(job, out):
        nodes(job)
        if not remote.take_model(job, out):
            raise FileNotFoundError(f"the nodes of run {job.run_id!r} finished, but {job.config['mirror']} holds no "
                                    "model")


# ---------------------------------------------------------------- evaluation
def resolve_policy(policy: str | ModelRef) -> ModelRef | None:
    """A ModelRef for a model folder or registry reference (aliases resolved to a version, downloaded and
    verified); None for the built-in `expert` and `random`."""
    if isinstance(policy, ModelRef):
        return policy
    if policy in ("expert", "random") or policy.startswith("serve://"):  # a server's model is asked, not loaded
        return None
    if policy.startswith("registry:"):
        from roboloop.registry import fetch

        path, reg, name, v, _ = fetch(policy)
        lin = reg.lineage(name, v)
        execution = ExecutionSettings(**lin["model"]["execution"]) if lin.get("model") else None
        return model_ref(path, lin.get("dataset_md5", ""), execution, registry=reg.uri, name=name, version=v)
    return model_ref(policy, dataset_md5="")


def _outcomes(report: dict) -> str | None:
    """'1'/'0' per episode in start order (None when the report does not number all its episodes)."""
    by_index = outcomes_by_episode(report.get("per_episode") or [])
    ok = by_index and sorted(by_index) == list(range(len(by_index)))
    return "".join("1" if by_index[i] else "0" for i in range(len(by_index))) if ok else None


def evaluate(policy: str | ModelRef, recipe: EvalRecipe, cache: ReceiptCache | None = None,
             runs_root: str | Path | None = None, save_rollouts: str | None = None,
             on_line: OnLine = print, against: str | None = None, registry: str | None = None,
             margin: float = 0.05, output_dir: str | Path | None = None) -> EvalSummary:
    """Exactly `recipe.episodes` episodes in a child process, into a run folder of its own; with
    `recipe.early_stop` and `against` (a registry model name), fewer when the paired decision against that
    model's champion is certain earlier. An explicit `output_dir` takes a cached result only if it is that folder."""
    from roboloop.evaluation.run import evaluate_in_subprocess

    model = resolve_policy(policy)
    if recipe.execute_steps is None:  # the settings the model was validated (and registered) with
        recipe = recipe.model_copy(update={"execute_steps": model.execution.execute_steps if model
                                           else ExecutionSettings().execute_steps})
    from roboloop.registry.reference import References, early_stop_references

    refs = early_stop_references(against, recipe, registry) if recipe.early_stop and against and \
        save_rollouts is None else References()
    label = policy if isinstance(policy, str) else f"{model.name or Path(model.path).name}"  # type: ignore[union-attr]
    if isinstance(policy, str) and policy.startswith("registry:") and model is not None and model.version:
        label = f"{model.name}@{model.version}"  # the version an alias resolved to (reach-vla@3), not "@champion"
    policy_id = model.weights_sha256 if model else str(policy)
    acts = acting_digest(model.path) if model else None  # config.json, stats.json: how the weights act
    key = cache_key("evaluate", policy_id, acts, keyed(recipe), save_rollouts is not None, refs.nominal, margin,
                    *([refs.perturbed] if refs.perturbed else []), *([refs.latency_p99] if refs.latency_p99 else []))
    cache = None if str(policy).startswith("serve://") else cache  # a server's model can change: never cached
    if cache and save_rollouts is None and (hit := cache.get(key, EvalSummary)) and \
            (output_dir is None or Path(hit.run_dir) == Path(output_dir).absolute()):
        return hit.model_copy(update={"reused": True})
    stamp = time.strftime("%Y%m%dT%H%M%S")
    run_dir = Path(output_dir).absolute() if output_dir else Path(runs_root or artifacts_root() / "evals") / \
        f"{slug(label, 32, keep_end=True)}-{slug(recipe.task, 32)}-{stamp}-{secrets.token_hex(2)}"
    cfg = EvalConfig.of(recipe, policy=model.path if model else str(policy), output_dir=str(run_dir),
                        save_rollouts=save_rollouts, stop_against=refs.nominal, stop_margin=margin, label=label,
                        stop_against_perturbed=refs.perturbed, stop_against_latency=refs.latency_p99)
    existed = run_dir.exists()
    try:
        report = evaluate_in_subprocess(cfg, on_line=on_line)
    except BaseException:
        if not existed and run_dir.is_dir():  # this call made it: a failed evaluation leaves no half of a run
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    full = (run_dir / "report.json").read_bytes()  # what the child wrote, per-episode rows included
    summary = EvalSummary(run_dir=str(run_dir.absolute()), report_sha256=hashlib.sha256(full).hexdigest(),
                          policy=label, policy_id=policy_id, task=recipe.task, episodes=report["episodes"],
                          successes=report["successes"], success_rate=report["success_rate"],
                          ci_low=report["ci_low"], ci_high=report["ci_high"], mean_length=report.get("mean_length"),
                          env_steps_per_s=report.get("env_steps_per_s"), seed=recipe.seed,
                          execution=ExecutionSettings(execute_steps=recipe.execute_steps or 4), plot=report.get("plot"),
                          videos=list(report.get("videos") or []), outcomes=_outcomes(json.loads(full)),
                          planned_episodes=report.get("planned_episodes"), stopped_early=report.get("stopped_early"),
                          looks=report.get("looks"),
                          perturbations=report.get("perturbations"), latency=report.get("latency"),
                          initial_states=report.get("initial_states"),
                          initial_states_sha256=report.get("initial_states_sha256"), envelope=report.get("envelope"))
    fsutil.atomic_write_text(run_dir / "summary.json", summary.model_dump_json(indent=1))
    if cache and save_rollouts is None:
        cache.put(key, summary)
    return summary


def evaluate_offline(model: ModelRef, data: DatasetRef, recipe: OfflineRecipe, episodes: list[int] | None = None,
                     cache: ReceiptCache | None = None, runs_root: str | Path | None = None) -> OfflineSummary:
    """The model's action-chunk error on `data`'s episodes it held out (or the given `episodes`), in a run
    folder of its own; for data with no simulator twin. Keyed on weights, config, dataset md5, recipe, episodes."""
    from roboloop.offline import evaluate_offline as score

    acts = acting_digest(model.path)
    key = cache_key("evaluate-offline", model.weights_sha256, acts, data.md5, keyed(recipe), episodes)
    if cache and (hit := cache.get(key, OfflineSummary)):
        return hit
    label = slug(model.name or Path(model.path).name, 32, keep_end=True)
    run_dir = Path(runs_root or artifacts_root() / "evals") / \
        f"{label}-offline-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    r = score(data.path, model.path, episodes if episodes is not None else "validation", recipe.stride,
              recipe.device, recipe.seed, output_dir=run_dir, plot_episodes=recipe.plot_episodes)
    s = OfflineSummary(run_dir=str(run_dir.absolute()), report_sha256=file_sha256(run_dir / "offline.json"),
                       policy_id=model.weights_sha256, dataset_md5=data.md5, episodes=r.episodes, samples=r.samples,
                       stride=r.stride, seed=recipe.seed, mse_norm=r.mse_norm,
                       per_episode={str(k): v for k, v in r.per_episode_mse_norm.items()},
                       action_names=r.action_names, mae=r.mae, mae_norm=r.mae_norm, plot=r.plot,
                       baselines={name: {"mse_norm": b["mse_norm"],
                                         "per_episode": {str(k): v for k, v in b["per_episode"].items()}}
                                  for name, b in r.baselines.items()})
    if cache:
        cache.put(key, s)
    return s


def sweep_candidates(run: str | Path, include_final: bool = True) -> list[tuple[int, ModelRef]]:
    """(step, model) per kept checkpoint (exported as artifacts/models/<run>-step<N>), and the final model."""
    from roboloop.training.kept import export_checkpoint, kept_checkpoints
    run = Path(run).absolute()
    cfg = json.loads((run / "config.json").read_text()) if (run / "config.json").is_file() else None
    if cfg is None:
        raise FileNotFoundError(f"{run}: no config.json; not a roboloop training run")
    dataset = cfg["train"].get("dataset", "")
    data_md5 = dir_md5(dataset) if dataset and Path(dataset).is_dir() else ""
    out = []
    for step, ckpt in kept_checkpoints(run):
        path = export_checkpoint(run, ckpt, step, artifacts_root() / "models" / f"{run.name}-step{step:08d}")
        out.append((step, model_ref(path, data_md5)))
    if include_final and (run / "model.safetensors").is_file():
        out.append((int(cfg["train"]["steps"]), model_ref(run, data_md5)))
    if not out:
        raise ValueError(f"{run}: no kept checkpoint and no final model to sweep")
    return out


# ---------------------------------------------------------------- reinforcement learning


def rl_finetune(parent: ModelRef, recipe: RLRecipe, cache: ReceiptCache | None = None,
                output_dir: str | Path | None = None, track: bool = False, on_line: OnLine = print,
                timeout_s: float | None = None) -> ModelRef:
    """Flow-noise PPO from `parent` in Isaac Lab on Ray workers (a child process group; resumes its checkpoints).
    Keyed on the parent's weights and the recipe; the result runs with the recipe's execute_steps."""
    from roboloop.rl.config import RLConfig
    from roboloop.rl.run import rl_in_subprocess

    key = cache_key("rl", parent.weights_sha256, keyed(recipe))
    if cache and (hit := cache.get(key, ModelRef)):
        return hit
    name = f"{slug(Path(parent.path).name, 32, keep_end=True)}-{recipe.mode}-{key.split('-')[-1][:12]}"
    out = Path(output_dir) if output_dir else artifacts_root() / "rl" / name
    result = rl_in_subprocess(RLConfig(**recipe.model_dump(), policy=parent.path, output_dir=str(out)), on_line,
                              timeout_s)
    execution = ExecutionSettings(execute_steps=recipe.execute_steps, inference_steps=parent.execution.inference_steps)
    ref = model_ref(result["model_dir"], parent.dataset_md5, execution, track)
    if cache:
        cache.put(key, ref)
    return ref


# ---------------------------------------------------------------- registry
def register(model: ModelRef, lineage: Lineage, name: str, registry: str | None = None, margin: float = 0.05,
             promote: bool = True) -> Decision:
    """A registry version for `model` (the same weights are never registered twice), then the promotion gate."""
    from roboloop.registry import CorruptVersionError, Registry

    reg = Registry(registry)
    version = None
    for v in reg.versions(name):
        try:
            if reg.lineage(name, v).get("metrics", {}).get("weights_sha256") == model.weights_sha256:
                version = v
        except CorruptVersionError:
            continue
    reused = version is not None
    if version is None:
        version = reg.register(name, model.path, lineage.model_dump(mode="json"))
    if not promote:
        return Decision(registry=reg.uri, name=name, version=version, reused=reused)
    d = reg.promote(name, version, margin=margin, rescore=_offline_rescorer(reg.uri, name, lineage))
    return d.model_copy(update={"reused": reused})


def parent_dataset(parent: ModelRef) -> DatasetRef:
    """The dataset a model was trained on: from its registry lineage, else its training config's folder (what an
    RL child's lineage names)."""
    if parent.registry and parent.name and parent.version:
        from roboloop.registry import Registry

        lin = Registry(parent.registry).lineage(parent.name, parent.version)
        if lin.get("dataset"):
            return DatasetRef.model_validate(lin["dataset"])
    path = parent.config.get("dataset", "")
    if not path or not Path(path).is_dir():
        raise FileNotFoundError(f"{parent.path}: its training dataset {path!r} is not here and it has no registry "
                                "lineage; the registry needs the dataset's md5 (restore it with dvc pull)")
    return dataset_ref(path)


def _offline_rescorer(uri: str, name: str, lineage: Lineage) -> Callable[[int, dict], dict] | None:
    """For a version evaluated offline only: scores a champion on the same held-out episodes of the same
    dataset, stride and noise seed, so the gate pairs them (the champion may have trained on some of those
    episodes, which can only favour it: the comparison errs against promotion)."""
    off, data = lineage.offline, lineage.dataset
    if off is None or data is None:
        return None

    def rescore(champion: int, _offline_eval: dict) -> dict:
        model = resolve_policy(f"registry:{uri}#{name}@{champion}")
        assert model is not None
        recipe = OfflineRecipe(stride=off.stride, seed=off.seed, plot_episodes=0)
        return evaluate_offline(model, data, recipe, episodes=off.episodes, cache=ReceiptCache()).gate_record()

    return rescore
