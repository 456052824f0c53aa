"""`roboloop` command line: one subcommand per stage, options generated from the pydantic configs.

The parser is assembled from one module per command group (`GROUPS`, each with `add_parsers(sub, options)`); what
they share is roboloop/cli/common.py."""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import traceback

from roboloop import __version__
from roboloop.cli.common import Options, explain


def _subcommand(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


GROUPS = ("data", "stages", "loop", "serve", "cluster", "registry", "plan")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser (argv None), or the one `argv` needs: options generated from a pydantic config are added
    only to the subcommand being run, so `roboloop --help` imports no config module (start-up <= 0.5 s)."""
    options = Options(None if argv is None else _subcommand(argv), everything=argv is None)
    p = argparse.ArgumentParser(prog="roboloop", description="Robot-learning closed loop: data, training, "
                                "evaluation, registry.")
    p.add_argument("--version", action="version", version=f"roboloop {__version__}")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        importlib.import_module(f"roboloop.cli.{group}").add_parsers(sub, options)
    return p


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
    child or thread is left (`roboloop.procs.exit_now`: finalizing torch's modules took ~1 s of each command
    here). A failure or an interruption exits normally. Torch's threads here and in every child wait passively
    (`roboloop.procs.passive_waits`), set before anything imports torch."""
    import os

    from roboloop.procs import passive_waits

    passive_waits(os.environ)
    code = main()
    if code == 0:
        from roboloop.procs import exit_now

        exit_now(0)
    sys.exit(code)


if __name__ == "__main__":
    run()
