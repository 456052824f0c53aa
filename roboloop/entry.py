"""`python -m roboloop.entry STAGE CONFIG.json`: the one entry of roboloop's child processes.

torchrun ranks (`train`), simulator runs (`evaluate`), demonstration recording (`collect`) and RL (`rl`)
start here with a config file. Unlike the user-facing CLI, nothing is parsed from flags and no
launch setting is read from the environment: a rank can never start another torchrun, whatever
the pod's environment says. The last stdout line is the stage's JSON result; failures exit 2
with one line naming the cause.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _train(path: Path) -> dict:
    from roboloop.training.config import TrainConfig
    from roboloop.training.train import train

    r = train(TrainConfig.model_validate_json(path.read_text()))
    return {"output_dir": str(r.output_dir), "first_loss": r.first_loss, "final_loss": r.final_loss,
            "steps": r.steps, "resumed_from": r.resumed_from}


def _evaluate(path: Path) -> dict:
    from roboloop.evaluation.config import EvalConfig
    from roboloop.evaluation.run import run_evaluation

    return json.loads(run_evaluation(EvalConfig.model_validate_json(path.read_text())).to_json())


def _collect(path: Path) -> dict:
    from roboloop.evaluation.config import CollectConfig
    from roboloop.evaluation.run import collect

    dst, report = collect(CollectConfig.model_validate_json(path.read_text()))
    return {"dst": str(dst), "expert_success_rate": report.success_rate, "episodes": report.episodes,
            "actor": report.policy}


def _rl(path: Path) -> dict:
    from roboloop.rl.config import RLConfig
    from roboloop.rl.run import progress_line, run

    def show(event: dict) -> None:
        print("[progress] " + progress_line(event), file=sys.stderr, flush=True)

    return run(RLConfig.model_validate_json(path.read_text()), on_event=show).__dict__


def _check_model(path: Path) -> dict:
    from roboloop.serving.follow import ModelCheck
    from roboloop.serving.service import load_slot

    c = ModelCheck.model_validate_json(path.read_text())
    slot = load_slot(Path(c.folder), c.version, c.device, c.seed, None, c.precision)
    return {"version": slot.version, "interface": list(map(str, slot.interface()))}


def _preload() -> None:
    """What every simulator stage imports first (~1 s of torch, roboloop's evaluation and LeRobot's configs); Isaac
    Lab's and Warp's modules load with the first stage's scene and stay."""
    import torch  # noqa: F401

    import roboloop.evaluation.evaluator  # noqa: F401
    import roboloop.evaluation.gym_env  # noqa: F401
    import roboloop.evaluation.policies  # noqa: F401
    import roboloop.evaluation.run  # noqa: F401


STAGES = {"train": _train, "evaluate": _evaluate, "collect": _collect, "rl": _rl, "check-model": _check_model}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in STAGES:
        print(f"usage: python -m roboloop.entry {{{'|'.join(STAGES)}}} CONFIG.json", file=sys.stderr)
        return 2
    from roboloop.cli.common import explain, jsonline

    try:
        result = STAGES[args[0]](Path(args[1]))
    except Exception as e:  # one line naming the cause; the parent re-logs it
        import traceback

        traceback.print_exc()
        message, code = explain(e)
        print(f"{type(e).__name__}: {message.splitlines()[0] if message else ''}", file=sys.stderr, flush=True)
        return code
    print(jsonline(result), flush=True)
    return 0


def exit_now(code: int) -> None:
    """Leave without the interpreter's teardown when nothing is left to it: no child process and no thread but
    this one (a daemon thread excepted) still running; all outputs are written and closed by then. Finalizing
    Isaac Lab's, Warp's and torch's modules took ~3 s of each ~15 s simulator child here. Otherwise (a local Ray,
    an unfinished writer thread) this returns and the caller exits normally, so the exit handlers stop them."""
    import contextlib
    import logging
    import os
    import threading

    import psutil

    if psutil.Process().children() or any(t is not threading.main_thread() and t.is_alive() and not t.daemon
                                           for t in threading.enumerate()):
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:] == ["--warm"]:  # a warm worker: stages read from stdin, one at a time (roboloop.warm)
        from roboloop.warm import worker_main

        code = worker_main(STAGES, _preload)
    else:
        code = main()
    exit_now(code)
    sys.exit(code)
