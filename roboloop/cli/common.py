"""What every `roboloop` command shares: pydantic configs as options, one JSON line, one-line errors."""

from __future__ import annotations

import argparse
import importlib
import json
import math
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

if TYPE_CHECKING:
    from pydantic import BaseModel


def model_options(
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


class Options:
    """Adds a pydantic config's fields to a subcommand's parser, but only for the subcommand being run (or all of
    them, for the whole parser): `roboloop --help` then imports no config module (start-up <= 0.5 s)."""

    def __init__(self, wanted: str | None, everything: bool) -> None:
        self.wanted, self.everything = wanted, everything

    def __call__(self, parser, command: str, target: str, skip: frozenset[str] = frozenset()) -> None:
        if self.everything or self.wanted == command:
            module, name = target.split(":")
            model_options(parser, getattr(importlib.import_module(module), name), skip)


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


def model_from_args(model: type[BaseModel], args: argparse.Namespace, **extra) -> BaseModel:
    given = {k: v for k, v in vars(args).items() if k in model.model_fields and v is not None}
    return model(**given, **extra)


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
