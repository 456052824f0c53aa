"""DAgger rounds from a deliberately weak start: success per round on the reach task (CPU).

    python bench/dagger.py [--demos 16] [--rounds 3] [--episodes 96] [--round-episodes 64]

Round 0 trains the demo's recipe on only `--demos` scripted demonstrations; each later round lets the
current policy act for `--round-episodes` episodes, has the scripted expert label every state it
visited, aggregates those labels with the data so far as a new dataset version, continues training
from the previous weights and evaluates on `--episodes` test-split episodes (Wilson 95% CI). Runs the
loop itself (`roboloop.loop.run_loop` with the library's stages, what `roboloop loop` runs) in a scratch
folder. Ends with one JSON line: success_by_round, ci_by_round, episodes_by_round, gain (last - first),
minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demos", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=96, help="evaluation episodes per round")
    ap.add_argument("--round-episodes", type=int, default=64, help="policy rollouts labelled per round")
    ap.add_argument("--steps", type=int, default=600, help="round-0 training steps")
    ap.add_argument("--round-steps", type=int, default=400, help="continued-training steps per round")
    ap.add_argument("--work", help="keep everything here (default: a temporary folder)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="roboloop-dagger-")).absolute()
    os.environ["ROBOLOOP_ARTIFACTS"] = str(work / "artifacts")
    os.environ["ROBOLOOP_CACHE_DIR"] = str(work / "cache")
    os.environ["ROBOLOOP_REGISTRY"] = str(work / "registry")

    from roboloop.evaluation.config import CollectConfig, EvalRecipe
    from roboloop.loop import DaggerConfig, LocalSteps, LoopConfig, demo, run_loop

    base = demo()
    # the loop itself (roboloop.loop.run_loop), from a deliberately weak start
    cfg = LoopConfig.model_validate({**base.model_dump(), **{
        "source": str(work / "demos"), "model_name": "dagger-bench", "track": False, "baseline": False,
        "rounds": args.rounds + 1,
        "collect_if_missing": CollectConfig(episodes=args.demos, num_envs=min(16, args.demos), noise=0.5),
        "train": base.train.model_copy(update={"steps": args.steps}),
        "eval": EvalRecipe(episodes=args.episodes, num_envs=min(16, args.episodes),
                           execute_steps=base.eval.execute_steps, videos=0),
        "dagger": DaggerConfig(episodes=args.round_episodes, num_envs=min(32, args.round_episodes),
                               steps=args.round_steps)}})
    t0 = time.time()
    s = run_loop(cfg, LocalSteps(on_line=lambda line: None))
    for r in s.rounds:
        print(json.dumps({"round": r.round, "episodes": r.episodes, "success": r.success_rate,
                          "ci": [round(r.ci_low, 3), round(r.ci_high, 3)]}), flush=True)
    success = [r.success_rate for r in s.rounds]
    print(json.dumps({"bench": "dagger", "success_by_round": success,
                      "ci_by_round": [[round(r.ci_low, 3), round(r.ci_high, 3)] for r in s.rounds],
                      "episodes_by_round": [r.episodes for r in s.rounds], "gain": round(success[-1] - success[0], 3),
                      "eval_episodes": args.episodes, "minutes": round((time.time() - t0) / 60, 1),
                      "work": str(work)}))


if __name__ == "__main__":
    main()
