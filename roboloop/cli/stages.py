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

from roboloop.cli.common import Options, jsonline, model_from_args

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
    print(jsonline({**receipt.model_dump(mode="json"), **extra}))


def cmd_convert(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from roboloop import stages
    from roboloop.datasets.convert import ConvertConfig, validate_source, workers_forked_now
    from roboloop.datasets.validate import DatasetDefectError
    from roboloop.hashing import remembering

    cfg: ConvertConfig = model_from_args(ConvertConfig, args)  # type: ignore[assignment]
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
    from roboloop.s3 import is_s3
    from roboloop.training.config import LaunchConfig, TrainConfig
    from roboloop.training.outdir import dataset_fingerprint

    cfg: TrainConfig = TrainConfig.model_validate_json(Path(args.config).read_text()) if args.config else \
        model_from_args(TrainConfig, args)  # type: ignore[assignment]
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
    from roboloop.evaluation.config import EvalConfig, EvalRecipe

    if args.offline:
        return _evaluate_offline(args)
    offline_only = {"--dataset": args.dataset is not None, "--score": args.score != "validation",
                    "--stride": args.stride != 1, "--against": args.against is not None,
                    "--margin": args.margin != 0.05}
    if any(offline_only.values()):  # refuse, never ignore
        raise ValueError(f"{', '.join(k for k, v in offline_only.items() if v)} apply to evaluate --offline only; "
                         "a simulator evaluation plays --episodes of --task")
    cfg: EvalConfig = model_from_args(EvalConfig, args)  # type: ignore[assignment]
    recipe = EvalRecipe(**cfg.model_dump(include=set(EvalRecipe.model_fields)))
    summary = stages.evaluate(cfg.policy, recipe, cache=None if cfg.save_rollouts else _cache(args),
                              save_rollouts=cfg.save_rollouts, output_dir=args.output_dir,  # None: a new run folder
                              on_line=ChildLines(args.verbose))
    report = json.loads((Path(summary.run_dir) / "report.json").read_text())
    print(jsonline({**report, "run_dir": summary.run_dir, "report_sha256": summary.report_sha256}))
    return 0


def cmd_pick(args: argparse.Namespace) -> int:
    from roboloop import stages
    from roboloop.evaluation.config import EvalRecipe
    from roboloop.loop.sweep import Scored, best

    recipe: EvalRecipe = model_from_args(EvalRecipe, args)  # type: ignore[assignment]
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
    from roboloop.offline import compare, evaluate_offline

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


def add_parsers(sub, options: Options) -> None:
    """The parsers of train, evaluate, compare, pick, rl and collect."""
    t = sub.add_parser("train", help="train a policy (--family; roboloop's VLA by default) on a v3 dataset "
                      "(resumes from its checkpoints)")
    t.add_argument("--config", help="a TrainConfig JSON file (what flows hand to torchrun ranks)")
    t.add_argument("--overwrite", action="store_true", help="move an existing run in --output-dir aside (never "
                   "deleted) and start over; without it, only a matching run is resumed")
    options(t, "train", "roboloop.training.config:TrainConfig")
    options(t.add_argument_group("torchrun (N > 1 ranks or nodes)"), "train", "roboloop.training.config:LaunchConfig")
    add_stage_flags(t)
    t.set_defaults(fn=cmd_train)

    e = sub.add_parser("evaluate", help="run a policy for exactly N episodes in Isaac Lab or gymnasium; "
                       "ends with one JSON line (success_rate, ci_low, ci_high, ...)")
    options(e, "evaluate", "roboloop.evaluation.config:EvalConfig")
    off = e.add_argument_group("offline (recorded data, no simulator)")
    off.add_argument("--offline", action="store_true", help="score action-chunk predictions on held-out episodes "
                     "of --dataset instead of running a simulator; ends with one JSON line")
    off.add_argument("--dataset", help="LeRobot v3.0 dataset folder (the one the model was trained on)")
    off.add_argument("--score", default="validation", help="validation (the model's held-out split), all, or "
                     "a comma-separated list of episode indices")
    off.add_argument("--stride", type=int, default=1, help="score every N-th frame")
    off.add_argument("--against", help="a second model: paired comparison on the same frames (challenger = --policy)")
    off.add_argument("--margin", type=float, default=0.05, help="non-inferiority margin, relative to the "
                     "--against model's error")
    add_stage_flags(e, track=False)
    e.set_defaults(fn=cmd_evaluate)
    cp = sub.add_parser("compare", help="paired comparison of two evaluation runs on the same episodes (task, "
                        "seed): difference, 95%% interval, decision or episodes still needed; one JSON line per pair, "
                        "then a pooled one when several pairs are given")
    cp.add_argument("runs", nargs="+", metavar="RUN", help="CHALLENGER CHAMPION evaluation run folders "
                    "(report.json); more pairs (e.g. one per training seed) add a pooled line last, its interval "
                    "clustered by episode across pairs on the same task and seed")
    cp.add_argument("--margin", type=float, default=0.05, help="non-inferiority margin on the success rate")
    cp.set_defaults(fn=cmd_compare)
    pk = sub.add_parser("pick", help="play a training run's kept checkpoints and final model on the same episodes "
                        "(a --seed other than the one results are reported on; 1 unless given) and name the best "
                        "(what the loop's `select` does); one JSON line per model, then the pick")
    pk.add_argument("run", help="a training run's folder (artifacts/models/...): its checkpoints/ and final model")
    options(pk, "pick", "roboloop.evaluation.config:EvalRecipe")
    add_stage_flags(pk, track=False)
    pk.set_defaults(fn=cmd_pick, seed=1, videos=0)
    rl = sub.add_parser("rl", help="RL fine-tuning (flow-noise PPO) of a model in Isaac Lab on Ray workers, sync or "
                        "async; writes OUTPUT_DIR/model")
    rl.add_argument("--config", help="an RLConfig JSON file")
    options(rl, "rl", "roboloop.rl.config:RLConfig")
    rl.set_defaults(fn=cmd_rl)

    co = sub.add_parser("collect", help="record scripted-expert episodes as a LeRobot v2.1 dataset")
    co.add_argument("dst")
    options(co, "collect", "roboloop.evaluation.config:CollectConfig", skip=frozenset({"dst"}))
    co.set_defaults(fn=cmd_collect)


def cmd_compare(args: argparse.Namespace) -> int:
    from roboloop.binomial import outcomes_by_episode, paired_difference, pooled_paired_difference

    if len(args.runs) % 2:
        raise SystemExit(f"compare takes runs in pairs (CHALLENGER CHAMPION ...), got {len(args.runs)}")
    pairs = []
    for ch, cp in zip(args.runs[::2], args.runs[1::2], strict=True):
        runs = []
        for d in (ch, cp):
            rep = json.loads((Path(d) / "report.json").read_text())
            runs.append((rep, outcomes_by_episode(rep.get("per_episode") or [])))
        (a, ea), (b, eb) = runs
        if (a["task"], a.get("seed")) != (b["task"], b.get("seed")):
            raise SystemExit(f"not paired: {a['task']} seed {a.get('seed')} vs {b['task']} seed {b.get('seed')}; "
                             "evaluate both on the same task and seed")
        print(jsonline({"challenger": a["policy"], "champion": b["policy"], **paired_difference(ea, eb, args.margin)}))
        pairs.append((ea, eb, (a["task"], a.get("seed"))))
    if len(pairs) > 1:  # pooled, clustered by episode where pairs share their task and seed
        print(jsonline({"pooled": True, **pooled_paired_difference(pairs, args.margin)}))
    return 0


def cmd_rl(args: argparse.Namespace) -> int:
    from roboloop.rl.config import RLConfig
    from roboloop.rl.run import progress_line, run

    cfg = RLConfig.model_validate_json(Path(args.config).read_text()) if args.config else \
        model_from_args(RLConfig, args)
    result = run(cfg, on_event=lambda e: print(progress_line(e), file=sys.stderr, flush=True))  # type: ignore[arg-type]
    print(jsonline(result.__dict__))
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    from roboloop.evaluation.run import CollectConfig, collect

    dst, report = collect(model_from_args(CollectConfig, args))  # type: ignore[arg-type]
    print(jsonline({"dst": str(dst), "expert_success_rate": report.success_rate, "episodes": report.episodes,
            "actor": report.policy}))
    return 0
