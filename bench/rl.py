"""RL fine-tuning on the reach task (CPU): sync against async at the same budget, and what RL adds.

    python bench/rl.py [--env-steps 400000] [--bc-steps 200] [--episodes 96] [--dataset V3_DIR] [--learner-device cpu]

1. A deliberately under-trained behaviour-cloned policy: the demo's demonstrations recipe (collected
   here unless --dataset gives a v3 folder), `--bc-steps` steps of the demo's training recipe.
2. `sync` and `async` RL from it with the same environment-step budget, 2 Isaac Lab env workers.
3. Every policy evaluated by the same Evaluator on the same `--episodes` test-split episodes.

Ends with one JSON line: sync_env_steps_per_s, async_env_steps_per_s, async_speedup (target >= 1.4),
{mode}_cpu_busy (the share of all this machine's cores busy during the run's updates),
{mode}_core_s_per_kstep (core-seconds per 1,000 environment steps: busy x cores x wall / steps) and,
with a CPU learner, async_speedup_ceiling = async_speedup / async_cpu_busy: the speedup async would
reach at its measured CPU cost per step with every core busy, the most any better overlap can give on
this machine (a GPU learner moves work off the CPU, and there the ceiling does not apply),
success_before, success_after (async), success_after_sync (success at equal env steps for both modes),
gain (points), and the Wilson intervals.
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
MEASURES = ["bench/rl.py", "roboloop/rl", "roboloop/policies", "roboloop/evaluation"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env-steps", type=int, default=400_000)
    ap.add_argument("--bc-steps", type=int, default=200)
    ap.add_argument("--episodes", type=int, default=96)
    ap.add_argument("--dataset", help="a v3 dataset of the reach task (default: collect the demo's demonstrations)")
    ap.add_argument("--learner-device", default="cpu")
    ap.add_argument("--modes", default="sync,async")
    ap.add_argument("--work", help="keep everything here (default: a temporary folder)")
    ap.add_argument("--demos", type=int, help="demonstrations to record (default: the demo's; fewer for a smoke run)")
    ap.add_argument("--rl", default="{}", help="JSON of RLRecipe fields to change")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="roboloop-rl-")).absolute()
    os.environ["ROBOLOOP_ARTIFACTS"] = str(work / "artifacts")
    os.environ["ROBOLOOP_CACHE_DIR"] = str(work / "cache")

    from roboloop import stages
    from roboloop.datasets.config import ConvertConfig
    from roboloop.evaluation.config import EvalRecipe
    from roboloop.loop import demo
    from roboloop.rl.config import RLRecipe
    from roboloop.rl.run import read_metrics

    quiet = lambda line: None  # noqa: E731
    base = demo()
    task = "Roboloop-Reach-Color-v0"
    if args.dataset:
        data = stages.dataset_ref(args.dataset)
    else:
        collect = base.collect_if_missing
        if args.demos and collect is not None:
            collect = collect.model_copy(update={"episodes": args.demos, "num_envs": min(collect.num_envs, args.demos)})
        raw = stages.ingest(str(work / "demos"), collect=collect, on_line=quiet)
        data = stages.convert(raw, ConvertConfig(progress=False))
    bc = stages.train(data, base.train.model_copy(update={"steps": args.bc_steps}), on_line=quiet)
    ev = EvalRecipe(task=task, episodes=args.episodes, num_envs=min(16, args.episodes), execute_steps=4, videos=0)
    out: dict = {"bench": "rl", "env_steps": args.env_steps, "bc_steps": args.bc_steps, "eval_episodes": args.episodes,
                 "cpus": os.cpu_count(), "learner_device": args.learner_device}
    before = stages.evaluate(bc, ev, on_line=quiet)
    out.update(success_before=before.success_rate, before_ci=[round(before.ci_low, 3), round(before.ci_high, 3)])
    print(json.dumps(out), flush=True)
    for mode in args.modes.split(","):
        recipe = RLRecipe(task=task, mode=mode, env_steps=args.env_steps, learner_device=args.learner_device,
                          **json.loads(args.rl))
        t0 = time.time()
        model = stages.rl_finetune(bc, recipe, on_line=quiet)
        rows = read_metrics(Path(model.path).parent)
        last = rows[-1]
        after = stages.evaluate(model, ev, on_line=quiet)
        spans = [b["wall_s"] - a["wall_s"] for a, b in zip([{"wall_s": 0.0}, *rows], rows, strict=False)]
        busy = sum(r["cpu_busy"] * d for r, d in zip(rows, spans, strict=True)) / max(sum(spans), 1e-9)
        out.update({f"{mode}_env_steps_per_s": round(last["env_steps"] / last["wall_s"], 1),
                    f"{mode}_cpu_busy": round(busy, 3),
                    f"{mode}_core_s_per_kstep": round(1000 * busy * (os.cpu_count() or 1) * sum(spans)
                                                      / max(last["env_steps"], 1), 3),
                    f"{mode}_updates": last["version"], f"{mode}_dropped_segments": last["dropped_segments"],
                    f"{mode}_staleness_max": max(r["staleness_max"] for r in rows),
                    f"{mode}_wall_minutes": round((time.time() - t0) / 60, 2),
                    f"success_after_{mode}": after.success_rate,
                    f"after_{mode}_ci": [round(after.ci_low, 3), round(after.ci_high, 3)]})
        print(json.dumps(out), flush=True)
    if "sync_env_steps_per_s" in out and "async_env_steps_per_s" in out:
        out["async_speedup"] = round(out["async_env_steps_per_s"] / out["sync_env_steps_per_s"], 3)
        if args.learner_device == "cpu":
            # async's CPU cost per step with no core idle: what a perfect overlap could reach on these cores
            out["async_speedup_ceiling"] = round(out["async_speedup"] / max(out["async_cpu_busy"], 1e-9), 3)
    last_mode = args.modes.split(",")[-1]
    out["success_after"] = out.get(f"success_after_{last_mode}")
    if out["success_after"] is not None:
        out["gain"] = round(100 * (out["success_after"] - out["success_before"]), 1)
    emit(out, MEASURES)


if __name__ == "__main__":
    main()
