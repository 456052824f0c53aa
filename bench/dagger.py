"""DAgger rounds from a deliberately weak start: success per round on the reach task (CPU).

    python bench/dagger.py [--demos 16] [--rounds 3] [--episodes 96] [--round-episodes 64]

Round 0 trains the demo's recipe on only `--demos` scripted demonstrations; each later round lets the
current policy act for `--round-episodes` episodes, has the scripted expert label every state it
visited, aggregates those labels with the data so far as a new dataset version, continues training
from the previous weights and evaluates on `--episodes` test-split episodes (Wilson 95% CI). Runs the
library's stages (what the `closed-loop` flow's tasks call) in a scratch artifacts folder. Ends with
one JSON line: success_by_round, ci_by_round, episodes_by_round, gain (last - first), minutes.
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

    from roboloop import stages
    from roboloop.datasets.config import ConvertConfig
    from roboloop.evaluation.config import CollectConfig, EvalRecipe
    from roboloop.loop import DaggerConfig, demo

    quiet = lambda line: None  # noqa: E731
    base = demo()
    recipe = base.train.model_copy(update={"steps": args.steps})
    ev = EvalRecipe(episodes=args.episodes, num_envs=min(16, args.episodes), execute_steps=base.eval.execute_steps,
                    videos=0)
    dg = DaggerConfig(episodes=args.round_episodes, num_envs=min(32, args.round_episodes))
    t0 = time.time()
    raw = stages.ingest(str(work / "demos"), collect=CollectConfig(episodes=args.demos, num_envs=min(16, args.demos),
                                                                      noise=0.5),
                        on_line=quiet)
    conv = ConvertConfig(progress=False)
    data = stages.convert(raw, conv)
    model = stages.train(data, recipe, on_line=quiet)
    rows = []

    def record(r: int) -> None:
        s = stages.evaluate(model, ev, on_line=quiet)
        rows.append({"round": r, "episodes": data.num_episodes, "success": s.success_rate,
                     "ci": [round(s.ci_low, 3), round(s.ci_high, 3)], "minutes": round((time.time() - t0) / 60, 1)})
        print(json.dumps(rows[-1]), flush=True)

    record(0)
    for r in range(1, args.rounds + 1):
        visited = stages.dagger_collect(model, CollectConfig(episodes=dg.episodes, num_envs=dg.num_envs,
                                                             execute_steps=ev.execute_steps), r, on_line=quiet)
        raw = stages.aggregate([raw, visited])
        data = stages.convert(raw, conv)
        model = stages.train(data, recipe.model_copy(update={"init_from": model.path, "steps": args.round_steps,
                                                             "lr": dg.lr, "warmup_steps": 0}), on_line=quiet)
        record(r)
    success = [x["success"] for x in rows]
    print(json.dumps({"bench": "dagger", "success_by_round": success, "ci_by_round": [x["ci"] for x in rows],
                      "episodes_by_round": [x["episodes"] for x in rows], "gain": round(success[-1] - success[0], 3),
                      "eval_episodes": args.episodes, "minutes": round((time.time() - t0) / 60, 1),
                      "work": str(work)}))


if __name__ == "__main__":
    main()
