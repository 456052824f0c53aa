"""`roboloop registry | reproduce`: the model registry (local folder or s3://) and reruns from a version's
lineage."""

from __future__ import annotations

import argparse

from roboloop.cli.common import Options, jsonline


def add_parsers(sub, options: Options) -> None:
    """The parsers of registry and reproduce."""
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
        from roboloop.loop.registry_add import register_folder

        if not args.name or not args.ref:
            raise ValueError("registry add NAME MODEL_DIR: a model name and a model folder")
        added = register_folder(args.ref, args.name, args.registry, args.eval, promote=args.promote,
                                margin=args.margin, dataset=args.dataset, score_offline=args.score_offline)
        print(jsonline(added.model_dump(mode="json")))
        return 0 if added.promoted or not args.promote else 3
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from roboloop.loop.reproduce import reproduce

    report = reproduce(args.model, registry=args.registry, on_line=(lambda _line: None) if args.quiet else print)
    print(jsonline(report))
    return 0 if report["match"] else 4
