"""`roboloop convert | ingest | train | evaluate`: the loop's stages (`roboloop.stages`) from the command line.

Each returns the stage's receipt (the last line of output is one JSON object), uses the receipt cache (a rerun
with nothing changed is a verified hit: its output is checked, restored from DVC or recomputed when it is gone),
and DVC-tracks its output with `--track`. `evaluate` runs the simulator in a child process, as the loop does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from roboloop.cache import ReceiptCache
    from roboloop.datasets.config import ConvertConfig
    from roboloop.receipts import DatasetRef


def _cache(args: argparse.Namespace):
    from roboloop.cache import ReceiptCache

    return None if getattr(args, "no_cache", False) else ReceiptCache()


class ChildLines:
    """A child's output, passed to stderr as it comes, except a traceback (shown with -v): the command's own
    one-line error names the cause."""

    def __init__(self, verbose: bool = False):
        self.verbose, self.in_traceback = verbose, False

    def __call__(self, line: str) -> None:
        if line.startswith("Traceback (most recent call last)"):
            self.in_traceback = True
        if self.verbose or not self.in_traceback:
            print(line, file=sys.stderr, flush=True)


def _print(receipt, **extra) -> None:
    from roboloop.cli import jsonline

    print(jsonline({**receipt.model_dump(mode="json"), **extra}))


def cmd_convert(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from roboloop import stages
    from roboloop.cli import _model_from_args
    from roboloop.datasets.convert import ConvertConfig, validate_source, workers_forked_now
    from roboloop.datasets.validate import DatasetDefectError
    from roboloop.hashing import remembering

    cfg: ConvertConfig = _model_from_args(ConvertConfig, args)  # type: ignore[assignment]
    src = Path(args.src).resolve()
    try:
        # the source is validated on a thread while it is hashed and converted (into a temporary folder): the
        # validation's verdict gates the output check and the rename, and its defects are what is reported; the
        # converter's processes are forked first, while this process has no other thread
        with workers_forked_now(cfg.num_workers), remembering(), ThreadPoolExecutor(1) as pool:
            verdict = pool.submit(validate_source, src, cfg)  # type: ignore[arg-type]
            try:
                if not os.path.lexists(args.dst):
                    ref = _convert_while_hashing(src, cfg, Path(args.dst), _cache(args), args.track, verdict)
                else:
                    raw = stages.dataset_ref(args.src)
                    if raw.format == "v3.0":
                        verdict.result()  # refused: "v3.0 needs no conversion"
                    ref = stages.convert(raw, cfg, cache=_cache(args), dst=args.dst, track=args.track,  # type: ignore[arg-type]
                                         overwrite=args.overwrite, validated=verdict)
            except Exception:
                verdict.result()  # a defect of the source, named, before whatever it caused
                raise
            verdict.result()  # a cache hit too: the source must still validate
    except DatasetDefectError as e:
        print(e.report.to_json() if args.json else e.report.human(), file=sys.stderr)
        print(f"refused: {args.src} has {len(e.report.defects)} defect(s); nothing was written", file=sys.stderr)
        return 1
    _print(ref, dst=ref.path)
    return 0


def _convert_while_hashing(src: Path, cfg: ConvertConfig, dst: Path, cache: ReceiptCache | None, track: bool,
                           verdict: Future) -> DatasetRef:
    """`stages.convert` into a DST that does not exist yet, where no earlier result can be reused (a cached
    receipt names its folder): the source's md5 (the receipt's and the marker's key; ~0.5 s of a 250 MB
    dataset) is taken on a thread while the conversion runs, instead of before it."""
    from concurrent.futures import ThreadPoolExecutor

    from roboloop import stages
    from roboloop.cache import convert_key
    from roboloop.datasets.convert import convert

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(stages.dataset_ref, src)

        def key() -> str:
            return convert_key(pending.result().md5, cfg)

        convert(src, dst, cfg.model_copy(update={"progress": False}), False, lambda: {"key": key()}, verdict)
        ref = stages.dataset_ref(dst, source=pending.result().md5, track=track)
    if cache:
        cache.put(key(), ref)
    return ref


def cmd_ingest(args: argparse.Namespace) -> int:
    from roboloop import stages
    from roboloop.datasets.validate import DatasetDefectError

    try:
        ref = stages.ingest(args.source, cache_dir=args.cache_dir, deep=args.deep, workers=args.workers,
                            track=args.track, on_line=ChildLines(args.verbose))
    except DatasetDefectError as e:
        print(e.report.human(), file=sys.stderr)
        print(json.dumps({"path": str(args.source), "ok": False, "defects": len(e.report.defects)}))
        return 1
    _print(ref, ok=True)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from roboloop import stages
    from roboloop.cli import _model_from_args
    from roboloop.s3 import is_s3
    from roboloop.training.config import LaunchConfig, TrainConfig
    from roboloop.training.outdir import dataset_fingerprint

    cfg: TrainConfig = TrainConfig.model_validate_json(Path(args.config).read_text()) if args.config else \
        _model_from_args(TrainConfig, args)  # type: ignore[assignment]
    launch = LaunchConfig.from_settings(**{k: getattr(args, k, None) for k in LaunchConfig.model_fields})
    if is_s3(cfg.dataset):  # downloaded (verified) into the cache once; a rerun finds it there
        from roboloop.datasets.ingest import ingest
        from roboloop.settings import settings

        cfg = cfg.model_copy(update={"dataset": str(ingest(cfg.dataset, cache_dir=settings().cache_dir).path)})
    dataset_fingerprint(cfg.dataset)  # a missing or unreadable dataset is named before anything is hashed
    ranks = launch.nproc_per_node * launch.nnodes
    if launch.node_rank != 0:  # this node's ranks joined node 0's run: the model is node 0's to write
        from roboloop.training.launch import run_torchrun

        run_torchrun(cfg, launch, on_line=ChildLines(args.verbose), overwrite=args.overwrite)
        print(json.dumps({"node_rank": launch.node_rank, "nnodes": launch.nnodes, "ranks": ranks,
                          "model": "written by node_rank 0"}))
        return 0
    data = stages.dataset_ref(cfg.dataset)
    ref = stages.train(data, cfg.recipe(), launch, cache=_cache(args), output_dir=cfg.output_dir, track=args.track,
                       overwrite=args.overwrite, in_process=True, on_line=ChildLines(args.verbose))
    _print(ref, output_dir=ref.path, **ref.metrics, **({"ranks": ranks} if ranks > 1 else {}))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from roboloop import stages
    from roboloop.cli import _model_from_args
    from roboloop.evaluation.config import EvalConfig, EvalRecipe

    if args.offline:
        return _evaluate_offline(args)
    offline_only = {"--dataset": args.dataset is not None, "--score": args.score != "validation",
                    "--stride": args.stride != 1, "--against": args.against is not None,
                    "--margin": args.margin != 0.05}
    if any(offline_only.values()):  # refuse, never ignore
        raise ValueError(f"{', '.join(k for k, v in offline_only.items() if v)} apply to evaluate --offline only; "
                         "a simulator evaluation plays --episodes of --task")
    cfg: EvalConfig = _model_from_args(EvalConfig, args)  # type: ignore[assignment]
    recipe = EvalRecipe(**cfg.model_dump(include=set(EvalRecipe.model_fields)))
    summary = stages.evaluate(cfg.policy, recipe, cache=None if cfg.save_rollouts else _cache(args),
                              save_rollouts=cfg.save_rollouts, output_dir=args.output_dir,  # None: a new run folder
                              on_line=ChildLines(args.verbose))
    report = json.loads((Path(summary.run_dir) / "report.json").read_text())
    from roboloop.cli import jsonline

    print(jsonline({**report, "run_dir": summary.run_dir, "report_sha256": summary.report_sha256}))
    return 0


def cmd_pick(args: argparse.Namespace) -> int:
    from roboloop import stages
    from roboloop.cli import _model_from_args, jsonline
    from roboloop.evaluation.config import EvalRecipe
    from roboloop.evaluation.sweep import Scored, best

    recipe: EvalRecipe = _model_from_args(EvalRecipe, args)  # type: ignore[assignment]
    scored = []
    for step, model in stages.sweep_candidates(args.run):
        e = stages.evaluate(model, recipe, cache=_cache(args), on_line=ChildLines(args.verbose))
        scored.append(Scored(step, model.path, e.success_rate, e.ci_low, e.ci_high, e.successes, e.episodes, {}))
        print(jsonline({"step": step, "model": model.path, "successes": e.successes, "episodes": e.episodes,
                        "success_rate": e.success_rate, "ci_low": e.ci_low, "ci_high": e.ci_high,
                        "seed": e.seed, "run_dir": e.run_dir}), flush=True)
    top = best(scored)
    print(jsonline({"picked_step": top.step, "picked_model": top.model, "success_rate": top.success_rate,
                    "final_step": max(s.step for s in scored), "seed": recipe.seed, "episodes": recipe.episodes}))
    return 0


def _evaluate_offline(args: argparse.Namespace) -> int:
    from roboloop.evaluation.offline import compare, evaluate_offline

    if not args.dataset or not args.policy or args.policy in ("expert", "random"):
        raise SystemExit("evaluate --offline needs --dataset V3_DIR and --policy MODEL (a model folder or "
                         "registry:NAME@REF)")
    from roboloop.evaluation.config import EvalConfig

    kept = ("policy", "device", "seed", "output_dir")
    simulator_only = sorted(f"--{k.replace('_', '-')}" for k in EvalConfig.model_fields
                            if k not in kept and getattr(args, k, None) is not None)
    if simulator_only:  # refuse, never ignore
        raise ValueError(f"{', '.join(simulator_only)} apply to a simulator evaluation; evaluate --offline scores "
                         "the recorded frames of --dataset (--score, --stride, --against, --margin)")

    def model(ref: str) -> str:
        if ref.startswith("registry:"):
            from roboloop.registry import resolve_model_ref

            return str(resolve_model_ref(ref))
        return ref

    episodes = args.score if args.score in ("validation", "all") else [int(e) for e in args.score.split(",")]
    device = args.device or "cpu"
    if args.against:
        c = compare(args.dataset, model(args.policy), model(args.against), episodes, args.stride,
                    margin=args.margin, seed=args.seed or 0, device=device)
        print(c.line())
        return 0
    out = args.output_dir or f"artifacts/evals/offline-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    print(evaluate_offline(args.dataset, model(args.policy), episodes, args.stride, device, args.seed or 0,
                           output_dir=out).line())
    return 0


def add_stage_flags(parser: argparse.ArgumentParser, track: bool = True) -> None:
    if track:
        parser.add_argument("--track", action="store_true", help="DVC-track the output (and push it to the remote)")
    parser.add_argument("--no-cache", action="store_true", help="recompute even when a verified cached result exists")
