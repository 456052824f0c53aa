"""`roboloop validate | convert | ingest | generate | dvc-track`: datasets in, checked, converted and versioned
(`convert` and `ingest` run the loop's stages: roboloop/cli/stages.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from roboloop.cli.common import Options, jsonline, model_from_args
from roboloop.cli.stages import add_stage_flags, cmd_convert, cmd_ingest


def add_parsers(sub, options: Options) -> None:
    """The parsers of validate, convert, ingest, generate and dvc-track."""
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

    d = sub.add_parser("dvc-track", help="dvc add + push a stage output; prints its md5")
    d.add_argument("path")
    d.add_argument("--no-push", action="store_true")
    d.set_defaults(fn=cmd_dvc_track)


def cmd_validate(args: argparse.Namespace) -> int:
    from roboloop.datasets.ingest import ingest

    result = ingest(args.path, cache_dir=args.cache_dir, strict=False, deep=args.deep)
    report = result.report
    print(report.to_json() if args.json else report.human())
    return 0 if report.ok else 1


def cmd_generate(args: argparse.Namespace) -> int:
    from roboloop.datasets.generate import GenSpec, generate_v21

    spec = GenSpec.model_validate(model_from_args(GenSpec, args).model_dump())
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


def cmd_dvc_track(args: argparse.Namespace) -> int:
    from roboloop import dvc

    t = dvc.track(args.path, push=not args.no_push)
    print(jsonline({"path": str(t.path), "dvc_file": str(t.dvc_file), "md5": t.md5}))
    return 0
