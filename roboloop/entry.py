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
    import roboloop.evaluation.policies  # noqa: F401
    import roboloop.evaluation.run  # noqa: F401
    import roboloop.sim.gym_env  # noqa: F401


STAGES = {"train": _train, "evaluate": _evaluate, "collect": _collect, "rl": _rl, "check-model": _check_model}


def _run(stage: str, config: str) -> tuple[int, dict | None]:
    """(0, the stage's result), or (its exit code, None) after one line naming the cause (the parent re-logs it)."""
    from roboloop.cli.common import explain

    try:
        return 0, STAGES[stage](Path(config))
    except Exception as e:
        import traceback

        traceback.print_exc()
        message, code = explain(e)
        print(f"{type(e).__name__}: {message.splitlines()[0] if message else ''}", file=sys.stderr, flush=True)
        return code, None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in STAGES:
        print(f"usage: python -m roboloop.entry {{{'|'.join(STAGES)}}} CONFIG.json", file=sys.stderr)
        return 2
    from roboloop.cli.common import jsonline

    code, result = _run(args[0], args[1])
    if code == 0:
        print(jsonline(result), flush=True)
    return code


def warm_worker() -> int:
    """`python -m roboloop.entry --warm` (roboloop.warm): the imports every stage needs, then one request per stdin
    line, its result printed after `warm.MARK` and the request's job id. Exits on a failure (with the stage's code,
    as a cold child does), at EOF (its parent gone), after `warm.IDLE_EXIT_S` idle, or once it ran `WARM_MAX_JOBS`
    stages or holds more than `WARM_MAX_RSS` resident."""
    import select

    import psutil

    from roboloop import warm
    from roboloop.cli.common import jsonline

    _preload()
    jobs = 0
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], warm.IDLE_EXIT_S)
        line = sys.stdin.readline() if ready else ""
        if not line:
            return 0
        req = json.loads(line)
        code, result = _run(req["stage"], req["config"])
        if code:
            return code
        sys.stderr.flush()
        print(f"{warm.MARK} {req['job']} {jsonline(result)}", flush=True)
        jobs += 1
        if jobs >= warm.WARM_MAX_JOBS or psutil.Process().memory_info().rss > warm.WARM_MAX_RSS:
            return 0


if __name__ == "__main__":
    from roboloop.procs import exit_now

    code = warm_worker() if sys.argv[1:] == ["--warm"] else main()
    exit_now(code)
    sys.exit(code)
