"""`roboloop loop`: the closed loop from the command line, no Prefect server (the same stages, receipts and
caches as the `closed-loop` flow; progress on stderr, the summary on stdout: human lines, then one JSON line)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_parsers(sub, options) -> None:  # options: no pydantic-generated flags here
    lp = sub.add_parser("loop", help="run the closed loop (ingest, convert, train, evaluate, register; DAgger and RL "
                        "rounds as configured) without a Prefect server; ends with the summary's JSON line")
    lp.add_argument("--preset", default="demo", help="demo (default), ci, vision, nightly_gpu, so101 or so101_ci")
    lp.add_argument("--config", help="a LoopConfig as JSON (instead of --preset)")
    lp.add_argument("--override", metavar="JSON", help="settings merged over the preset or --config, e.g. "
                    "'{\"train\": {\"steps\": 500}}' (nested objects merge; an unknown name is refused)")
    lp.add_argument("--source", help="your dataset: a folder anywhere or s3://bucket/prefix (only read); the loop "
                    "then evaluates offline on the episodes training holds out, unless --evaluation simulator")
    lp.add_argument("--evaluation", choices=["offline", "simulator"], help="with --source: how to evaluate")
    lp.add_argument("--model-name", help="registry name (default: the preset's, or the source folder's name)")
    lp.add_argument("--no-track", action="store_true", help="do not DVC-track datasets and models")
    lp.set_defaults(fn=cmd_loop)


def config(args: argparse.Namespace):
    from roboloop.loop import PRESETS, LoopConfig, for_source

    if args.config:
        cfg = LoopConfig.model_validate_json(Path(args.config).read_text())
    elif args.preset in PRESETS:
        cfg = PRESETS[args.preset]()
    else:
        raise ValueError(f"unknown preset {args.preset!r}: choose one of {', '.join(sorted(PRESETS))}")
    if args.override:
        cfg = override(cfg, args.override)
    if args.source:
        cfg = for_source(cfg, args.source, args.evaluation or "offline", args.model_name)
    elif args.model_name:
        cfg = cfg.model_copy(update={"model_name": args.model_name})
    if args.no_track:
        cfg = cfg.model_copy(update={"track": False})
    return cfg


def override(cfg, text: str):
    """`cfg` with the JSON object `text` merged into it (roboloop.loop.form.override: every name checked)."""
    import json

    from roboloop.loop.form import override as merge_over

    try:
        over = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--override is not JSON: {e}") from None
    if not isinstance(over, dict):
        raise ValueError("--override takes a JSON object, e.g. '{\"train\": {\"steps\": 500}}'")
    return merge_over(cfg, over)


def cmd_loop(args: argparse.Namespace) -> int:
    from roboloop import dvc, stages
    from roboloop.loop import LocalSteps, run_loop

    cfg = config(args)
    if cfg.track and dvc.find_root(stages.artifacts_root()) is None:
        root = dvc.init_repo(Path.cwd())
        print(f"initialised a DVC repository in {root} (the loop versions its datasets and models here; "
              "--no-track to skip)", file=sys.stderr)
    t0 = time.time()
    s = run_loop(cfg, LocalSteps(on_line=lambda line: print(line, file=sys.stderr, flush=True)))
    print(s.report(time.time() - t0))
    return 0
