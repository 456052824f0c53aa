"""`roboloop` command line: one subcommand per stage, options generated from the pydantic configs."""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from roboloop import __version__
from roboloop.cli_stages import add_stage_flags, cmd_convert, cmd_evaluate, cmd_ingest, cmd_pick, cmd_train

if TYPE_CHECKING:
    from pydantic import BaseModel


def _add_model_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    model: type[BaseModel],
    skip: frozenset[str] = frozenset(),
) -> None:
    """Expose a pydantic model's scalar fields as --kebab-case options (one source of truth)."""
    for name, f in model.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        ann = f.annotation
        lit = next((a for a in get_args(ann) if get_origin(a) is Literal), None)  # Literal[...] | None
        if get_origin(ann) is Literal or lit is not None:
            parser.add_argument(flag, choices=get_args(lit if lit is not None else ann), default=None,
                                help=f.description)
        elif ann == dict[str, Any] or get_origin(ann) is dict:
            parser.add_argument(flag, type=json.loads, default=None, help=f"{f.description} (JSON)")
        elif ann is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=f.description)
        elif ann in (int, float, str) or ann in (int | None, float | None, str | None):
            typ: type = next(t for t in (int, float, str) if ann in (t, t | None))
            parser.add_argument(flag, type=typ, default=None, help=f.description)


def jsonline(obj, indent: int | None = None) -> str:
    """One JSON line that is always valid JSON: NaN/inf become null."""
    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(obj), allow_nan=False, default=str, indent=indent)


def _model_from_args(model: type[BaseModel], args: argparse.Namespace, **extra) -> BaseModel:
    given = {k: v for k, v in vars(args).items() if k in model.model_fields and v is not None}
    return model(**given, **extra)


def cmd_validate(args: argparse.Namespace) -> int:
    from roboloop.datasets.ingest import ingest

    result = ingest(args.path, cache_dir=args.cache_dir, strict=False, deep=args.deep)
    report = result.report
    print(report.to_json() if args.json else report.human())
    return 0 if report.ok else 1


def cmd_generate(args: argparse.Namespace) -> int:
    from roboloop.datasets.generate import GenSpec, generate_v21

    spec = GenSpec.model_validate(_model_from_args(GenSpec, args).model_dump())
    if args.camera:
        spec.cameras = {k: (h, w) for k, h, w in (_parse_cam(c) for c in args.camera)}
    if not args.v3:
        out = generate_v21(args.dst, spec)  # type: ignore[arg-type]
    else:  # v2.1 in a temporary sibling (ours, removed after), converted into DST
        import shutil

        from roboloop import fsutil
        from roboloop.datasets.convert import ConvertConfig, convert

        dst = Path(args.dst).absolute()
        fsutil.check_destination(dst, "dataset_v3")
        tmp = fsutil.temp_sibling(dst)
        try:
            out = convert(generate_v21(tmp, spec), dst, ConvertConfig(progress=False))  # type: ignore[arg-type]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(jsonline({"dst": str(out)}))
    return 0


def _parse_cam(text: str) -> tuple[str, int, int]:
    key, _, hw = text.partition("=")
    h, _, w = hw.partition("x")
    if not (key and h.isdigit() and w.isdigit()):
        raise argparse.ArgumentTypeError(f"--camera takes KEY=HxW, got {text!r}")
    return key, int(h), int(w)


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
        _model_from_args(RLConfig, args)
    result = run(cfg, on_event=lambda e: print(progress_line(e), file=sys.stderr, flush=True))  # type: ignore[arg-type]
    print(jsonline(result.__dict__))
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    from roboloop.evaluation.run import CollectConfig, collect

    dst, report = collect(_model_from_args(CollectConfig, args))  # type: ignore[arg-type]
    print(jsonline({"dst": str(dst), "expert_success_rate": report.success_rate, "episodes": report.episodes,
            "actor": report.policy}))
    return 0


def cmd_registry(args: argparse.Namespace) -> int:
    from roboloop.registry import Registry

    reg = Registry(args.registry)
    if args.action == "list":
        names = [args.name] if args.name else reg.models()
        out = []
        for n in names:
            al, _ = reg.aliases(n)
            out.append({"name": n, "versions": reg.versions(n), "champion": al.get("champion"),
                        "challenger": al.get("challenger"), "corrupt": reg.check(n)})
        print(jsonline(out, indent=2))
    elif args.action == "show":
        print(jsonline(reg.show(args.name, args.ref or "champion"), indent=2))
    elif args.action == "promote":
        d = reg.promote(args.name, args.ref, margin=args.margin, alpha=args.alpha, force=args.force)
        print(jsonline(d.model_dump(mode="json")))
        return 0 if d.promoted else 3
    elif args.action == "download":
        dst = args.dst or f"{args.name}-{args.ref or 'champion'}"
        print(reg.download(args.name, args.ref or "champion", dst, overwrite=args.overwrite))
    elif args.action == "add":
        from roboloop.registry_add import register_folder

        if not args.name or not args.ref:
            raise ValueError("registry add NAME MODEL_DIR: a model name and a model folder")
        added = register_folder(args.ref, args.name, args.registry, args.eval, promote=args.promote,
                                margin=args.margin, dataset=args.dataset, score_offline=args.score_offline)
        print(jsonline(added.model_dump(mode="json")))
        return 0 if added.promoted or not args.promote else 3
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from roboloop.reproduce import reproduce

    report = reproduce(args.model, registry=args.registry, on_line=(lambda _line: None) if args.quiet else print)
    print(jsonline(report))
    return 0 if report["match"] else 4


def cmd_dvc_track(args: argparse.Namespace) -> int:
    from roboloop import dvc

    t = dvc.track(args.path, push=not args.no_push)
    print(jsonline({"path": str(t.path), "dvc_file": str(t.dvc_file), "md5": t.md5}))
    return 0


def _subcommand(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser (argv None), or the one `argv` needs: options generated from a pydantic config are added
    only to the subcommand being run, so `roboloop --help` imports no config module (start-up <= 0.5 s)."""
    wanted = None if argv is None else _subcommand(argv)

    def options(parser, command: str, target: str, skip: frozenset[str] = frozenset()) -> None:
        if argv is None or wanted == command:
            import importlib

            module, name = target.split(":")
            _add_model_options(parser, getattr(importlib.import_module(module), name), skip)

    p = argparse.ArgumentParser(prog="roboloop", description="Robot-learning closed loop: data, training, "
                                "evaluation, registry.")
    p.add_argument("--version", action="version", version=f"roboloop {__version__}")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="report every defect of a LeRobot dataset (folder or s3://)")
    v.add_argument("path", help="dataset folder or s3://bucket/prefix")
    v.add_argument("--json", action="store_true", help="machine-readable report")
    v.add_argument("--deep", action="store_true", help="also decode every video frame")
    v.add_argument("--cache-dir", default=".roboloop/cache", help="where S3 datasets are downloaded")
    v.set_defaults(fn=cmd_validate)

    c = sub.add_parser("convert", help="convert a LeRobot v2.1 dataset to v3.0 (source untouched)")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--json", action="store_true", help="print a refused source's report as JSON")
    c.add_argument("--overwrite", action="store_true", help="replace an earlier roboloop conversion at DST (moved "
                   "aside, never deleted); other folders are never touched")
    options(c, "convert", "roboloop.datasets.config:ConvertConfig")
    add_stage_flags(c)
    c.set_defaults(fn=cmd_convert)

    i = sub.add_parser("ingest", help="download (S3) or register (folder) a dataset, verified and validated")
    i.add_argument("source")
    i.add_argument("--cache-dir", default=".roboloop/cache")
    i.add_argument("--workers", type=int, default=8)
    i.add_argument("--deep", action="store_true")
    add_stage_flags(i)
    i.set_defaults(fn=cmd_ingest)

    g = sub.add_parser("generate", help="write a synthetic LeRobot dataset with real mp4 video")
    g.add_argument("dst")
    g.add_argument("--camera", action="append", help="KEY=HxW (repeatable; replaces the default cameras)")
    g.add_argument("--v3", action="store_true", help="write v3.0 (generates v2.1 beside it, then converts)")
    options(g, "generate", "roboloop.datasets.config:GenSpec", skip=frozenset({"cameras", "image_keys", "tasks"}))
    g.set_defaults(fn=cmd_generate)

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

    from roboloop import cli_loop

    cli_loop.add_parser(sub)
    from roboloop import cli_serve

    cli_serve.add_parser(sub)
    from roboloop import cli_cluster

    cli_cluster.add_parser(sub)

    r = sub.add_parser("registry", help="model registry (local folder or s3://): list, show, promote, download, "
                       "add (register a model folder: registry add NAME MODEL_DIR [--eval RUN] [--promote])")
    r.add_argument("action", choices=["list", "show", "promote", "download", "add"])
    r.add_argument("name", nargs="?", help="model name")
    r.add_argument("ref", nargs="?", help="version (3, v3) or alias (champion, challenger); add: the model folder")
    r.add_argument("--eval", help="add: a `roboloop evaluate --output-dir` run of this model, kept for the gate")
    r.add_argument("--dataset", help="add: the v3 dataset the model was trained on (its md5 joins the lineage)")
    r.add_argument("--score-offline", choices=["validation", "all"], help="add: score it offline on --dataset (the "
                   "episodes it held out, or all of them when its split is unknown) and record that for the gate")
    r.add_argument("--promote", action="store_true", help="add: put it through the promotion gate (a first "
                   "version must beat a baseline)")
    r.add_argument("--registry", help="registry URI (default $ROBOLOOP_REGISTRY or .roboloop/registry)")
    r.add_argument("--dst", help="download destination")
    r.add_argument("--margin", type=float, default=0.05, help="non-inferiority margin on the success rate")
    r.add_argument("--alpha", type=float, default=0.05, help="test level")
    r.add_argument("--force", action="store_true", help="promote without the test")
    r.add_argument("--overwrite", action="store_true", help="download: replace an earlier roboloop download at "
                   "--dst (moved aside, never deleted); other folders are never touched")
    r.set_defaults(fn=cmd_registry)

    rp = sub.add_parser("reproduce", help="rerun the loop from a registered model's lineage; exit 0 iff "
                        "datasets, model and metrics match")
    rp.add_argument("model", help="NAME@VERSION or NAME@champion")
    rp.add_argument("--registry", help="registry URI (default $ROBOLOOP_REGISTRY or .roboloop/registry)")
    rp.add_argument("--quiet", action="store_true", help="do not stream the training/evaluation output")
    rp.set_defaults(fn=cmd_reproduce)

    d = sub.add_parser("dvc-track", help="dvc add + push a stage output; prints its md5")
    d.add_argument("path")
    d.add_argument("--no-push", action="store_true")
    d.set_defaults(fn=cmd_dvc_track)
    return p


def explain(e: BaseException) -> tuple[str, int]:
    """(one-line cause, exit code) for an exception reaching the CLI."""
    from roboloop import errors

    if isinstance(e, errors.RoboloopError):
        return str(e), e.exit_code
    if type(e).__module__.startswith(("botocore", "boto3")):
        from roboloop.s3 import translate_error

        return str(translate_error(e)), 2
    if isinstance(e, OSError):
        known = errors.from_os_error(e)
        if known is not None:
            return str(known), known.exit_code
        return f"{e.strerror or e}{': ' + str(e.filename) if e.filename else ''}", 2
    from pydantic import ValidationError

    if isinstance(e, ValidationError):  # one line per CLI error, naming the option, not pydantic's 4-line dump
        parts = [f"--{str(err['loc'][0]).replace('_', '-')}" + "".join(f".{x}" for x in err["loc"][1:])
                 + f" {err['input']!r}: {err['msg'].lower()}" if err["loc"] else err["msg"] for err in e.errors()]
        return "; ".join(parts), 2
    from roboloop.availability import MissingCapability

    if isinstance(e, ValueError | ImportError | KeyError | LookupError | MissingCapability):
        return str(e), 2
    return f"{type(e).__name__}: {e} (unexpected; run with -v for the traceback)", 1


def _terminate(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # SIGTERM (a cancelled Prefect run, `kill`) unwinds like Ctrl-C: temporary outputs are removed on the way out.
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args.fn(args) or 0)
    except KeyboardInterrupt:
        print(f"roboloop {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one error, one line (details of a report follow, indented); traceback behind -v
        if args.verbose:
            traceback.print_exc()
        message, code = explain(e)
        first, *rest = (message.strip() or type(e).__name__).splitlines()
        print(f"roboloop {args.command}: error: {first}", file=sys.stderr)
        for line in rest:
            print("  " + line.strip(), file=sys.stderr)
        return code


def run() -> None:
    """The `roboloop` command: `main`, then, after a success, an exit without the interpreter's teardown when no
    child or thread is left (`roboloop.entry.exit_now`: finalizing torch's modules took ~1 s of each command
    here). A failure or an interruption exits normally."""
    code = main()
    if code == 0:
        from roboloop.entry import exit_now

        exit_now(0)
    sys.exit(code)


if __name__ == "__main__":
    run()
