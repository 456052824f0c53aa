"""Can an offline score pick the checkpoint the simulator would? (`checkpoint-sweep`'s rank agreement)

    python bench/sweep.py [--preset demo|so101] [--steps N] [--every N] [--episodes 48] [--demos N] [--work DIR]
                          [--train '{"ema_decay": 0.999}']

Records the preset's demonstrations, trains its recipe holding out 10% of the episodes (`val_fraction`), keeps
a checkpoint every `--every` steps, and scores each (and the final model) in the simulator on the same
`--episodes` test-split episodes and offline: its training loss, and its action-chunk error on the held-out
episodes (what a team with only a real robot can compute). Prints per checkpoint, then one JSON line with
Spearman's rho (95% interval) between each offline score and the simulator's success, the checkpoint each
would pick, and how far short of the simulator's best that pick falls. No baseline tool: LeRobot and GR00T
select checkpoints by their training loss, which is the `train_loss` row.
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

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/sweep.py", "roboloop/evaluation", "roboloop/training", "roboloop/policies"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="demo", choices=["demo", "so101"])
    ap.add_argument("--steps", type=int, help="training steps (default: the preset's)")
    ap.add_argument("--every", type=int, default=200, help="steps between kept checkpoints")
    ap.add_argument("--episodes", type=int, default=48, help="simulator episodes per checkpoint")
    ap.add_argument("--demos", type=int, help="demonstrations to record (default: the preset's)")
    ap.add_argument("--work", help="keep everything here (default: a temporary folder)")
    ap.add_argument("--train", type=json.loads, default={}, help="JSON: TrainRecipe fields to change from the "
                    "preset's, e.g. '{\"ema_decay\": 0.999}'")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="roboloop-sweep-")).absolute()
    os.environ["ROBOLOOP_ARTIFACTS"] = str(work / "artifacts")
    os.environ["ROBOLOOP_CACHE_DIR"] = str(work / "cache")

    from roboloop import stages
    from roboloop.datasets.config import ConvertConfig
    from roboloop.evaluation.config import EvalRecipe
    from roboloop.loop import PRESETS
    from roboloop.loop.sweep import Scored, offline_scores, rank_agreement

    quiet = lambda line: None  # noqa: E731
    cfg = PRESETS[args.preset]()
    collect = cfg.collect_if_missing
    assert collect is not None
    if args.demos:
        collect = collect.model_copy(update={"episodes": args.demos, "num_envs": min(collect.num_envs, args.demos)})
    steps = args.steps or cfg.train.steps
    recipe = type(cfg.train).model_validate({**cfg.train.model_dump(), **args.train, "steps": steps,
                                             "val_fraction": 0.1, "checkpoint_every_steps": args.every,
                                             "keep_last": steps // args.every + 1})
    ev = EvalRecipe(task=cfg.eval.task, episodes=args.episodes, num_envs=min(16, args.episodes),
                    execute_steps=cfg.eval.execute_steps, videos=0)
    data = stages.convert(stages.ingest(str(work / "demos"), collect=collect, on_line=quiet),
                          ConvertConfig(progress=False))
    t0 = time.time()
    model = stages.train(data, recipe, on_line=quiet)
    train_minutes = round((time.time() - t0) / 60, 2)
    scored = []
    for step, m in stages.sweep_candidates(model.path):
        e = stages.evaluate(m, ev, on_line=quiet)
        scored.append(Scored(step, m.path, e.success_rate, e.ci_low, e.ci_high, e.successes, e.episodes,
                             offline_scores(model.path, step, m)))
        print(json.dumps({"step": step, "success": e.success_rate, **{k: round(v, 5)
                                                                       for k, v in scored[-1].offline.items()}}),
              flush=True)
    emit({"bench": "sweep", "preset": args.preset, "train": args.train, "task": ev.task, "steps": steps,
          "eval_episodes": args.episodes, "train_minutes": train_minutes, **rank_agreement(scored)}, MEASURES)


if __name__ == "__main__":
    main()
