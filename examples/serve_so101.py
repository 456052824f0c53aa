"""Serve the champion and drive the simulated SO-101 through the server, as a robot would be driven: the arm's
joint state and its front and wrist cameras go over the wire, a chunk of joint targets comes back.

    .venv/bin/python examples/serve_so101.py [registry:so101-pick@champion] [--episodes 4] [--out runs/so101-served]

The default is the champion `roboloop loop --preset so101` registers. `roboloop serve REF` loads the model in a
child process that imports nothing the model folder names, follows the registry (a new champion is checked, then
swapped in between requests) and answers on a WebSocket. Here Isaac Lab's SO-101 pick-up-the-cube task plays the
robot; on the real arm `roboloop robot` drives LeRobot's SO-101 class with the same client.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from roboloop import stages
from roboloop.evaluation.config import EvalRecipe
from roboloop.procs import kill_group
from roboloop.serving.check import start_server

TASK = "Roboloop-SO101-PickCube-v0"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref", nargs="?", default="registry:so101-pick@champion",
                    help="what to serve: registry:[URI#]NAME@VERSION|ALIAS, or a model folder")
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--num-envs", type=int, default=1, help="arms played at once (each its own client stream)")
    ap.add_argument("--seed", type=int, default=0, help="the cube positions")
    ap.add_argument("--out", default=None, help="the evaluation's run folder (report.json, videos)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="the server's torch threads")
    args = ap.parse_args(argv)

    server, port = start_server(args.ref, seed=args.seed, device="cpu", threads=args.threads, precision="fp32",
                                timeout_s=300, on_line=lambda line: print(line, file=sys.stderr))
    try:
        played = stages.evaluate(f"serve://127.0.0.1:{port}", EvalRecipe(
            task=TASK, episodes=args.episodes, num_envs=args.num_envs, seed=args.seed, videos=1),
            output_dir=args.out, on_line=lambda line: print(line, file=sys.stderr))
    finally:
        kill_group(server, 10.0)
    report = json.loads((Path(played.run_dir) / "report.json").read_text())
    served = report["served"]
    result = {"served": args.ref, "versions": served["versions"], "episodes": played.episodes,
              "successes": played.successes, "roundtrip_ms_p50": served["roundtrip_ms_p50"],
              "infer_ms_p50": served["infer_ms_p50"], "run": played.run_dir, "videos": played.videos}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
