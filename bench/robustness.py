"""The demo policy under perturbations and latency: how much of its success on nominal episodes survives.

    python bench/robustness.py [--episodes 48] [--perturb obs_noise,action_noise,actuator_gain,...]
                               [--latency measured,50,100,200] [--prefetch N] [--demos N] [--steps N] [--work DIR]
                               [--preset demo|so101] [--model MODEL_DIR|registry:NAME@REF]

Records the `make demo` recipe's demonstrations (`roboloop.loop.demo()`: 512 DART-noise episodes on
Roboloop-Reach-Color-v0), trains its policy (the VLA, state + language, 1,200 steps), then evaluates it and the
scripted expert on the same `--episodes` test-split episodes, nominal and under each factor and level of `--perturb`
(the demo policy reads no camera, so the image factors are left out by default: they cannot change what it does)
and with each `--latency` charged in simulated time (measured: the policy's own p50 and p99 chunk times here).
`--preset so101 --model MODEL` evaluates a model `roboloop loop --preset so101` trained (no recording or training
here) on the SO-101 pick as that preset evaluates it (16 envs, 4 actions per re-plan), the image factors included
when named. Baseline: each policy's nominal run on the same episodes (`drop` is paired, episode by episode).

Ends with one JSON line: for `policy` and `expert`, the nominal success and its interval, `perturbations` (factor ->
level -> success, interval, drop) and `latency` (setting -> ms, steps late, success, drop).

Each run is kept as a record in `bench/results/` (the Results page of the docs); the figures are there, not here.
For the SO-101 the factors worth naming are the cameras' (`frame_drop`, `camera_shift`, `brightness`, and
re-rendered: `camera_pose`, `camera_fov`) and the scene's (`object_pose`, `arm_pose`, `distractors`, `colour_swap`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/robustness.py", "roboloop/evaluation", "roboloop/policies", "roboloop/training"]


def brief(s) -> dict:
    return {"success": s.success_rate, "ci": [round(s.ci_low, 3), round(s.ci_high, 3)],
            "perturbations": {f: {lv: {k: round(c[k], 3) for k in ("success_rate", "ci_low", "ci_high", "drop")}
                                  for lv, c in levels.items()} for f, levels in (s.perturbations or {}).items()},
            "latency": {r["setting"]: {"ms": r["ms"], "steps_late": r["delay_steps"],
                                       "success": round(r["success_rate"], 3), "drop": round(r["drop"], 3)}
                        for r in (s.latency or [])}}


def _cell(c: dict | None) -> str:
    return "" if c is None else f"{c['success_rate']:.0%} [{c['ci_low']:.0%}, {c['ci_high']:.0%}] | {c['drop']:+.0%}"


def markdown(out: dict) -> str:
    """The record as tables: success per factor and level, then per latency, the policy beside the expert (drop:
    paired with each one's own nominal run; positive is worse)."""
    pol, exp = out["policy"], out["expert"]
    lines = [f"{out['task']}, {out['episodes']} test episodes; nominal: the policy {pol['success']:.0%} "
             f"[{pol['ci'][0]:.0%}, {pol['ci'][1]:.0%}], the expert {exp['success']:.0%}.", "",
             "| factor | level | policy | drop | expert | drop |", "|---|---|---|---|---|---|"]
    for factor, levels in pol["perturbations"].items():
        for level, c in levels.items():
            other = exp["perturbations"].get(factor, {}).get(level)
            lines.append(f"| {factor} | {level} | {_cell(c)} | {_cell(other) or ' | '} |")
    if pol["latency"]:
        lines += ["", "| latency | ms | steps late | policy | drop | expert | drop |", "|---|---|---|---|---|---|---|"]
        for setting, r in pol["latency"].items():
            e = exp["latency"].get(setting)
            theirs = f"{e['success']:.0%} | {e['drop']:+.0%}" if e else " | "
            lines.append(f"| {setting} | {r['ms']} | {r['steps_late']} | {r['success']:.0%} | {r['drop']:+.0%} | "
                         f"{theirs} |")
    return "\n".join(lines)


def train_preset(base, recipe, demos: int | None, work: Path) -> tuple[str, float]:
    """Record the preset's demonstrations (`demos` of them, if given) and train its recipe: the model and minutes."""
    from roboloop import stages
    from roboloop.datasets.config import ConvertConfig

    quiet = lambda line: None  # noqa: E731
    collect = base.collect_if_missing
    if demos:
        collect = collect.model_copy(update={"episodes": demos, "num_envs": min(collect.num_envs, demos)})
    raw = stages.ingest(str(work / "demos"), collect=collect, on_line=quiet)
    data = stages.convert(raw, ConvertConfig(progress=False))
    t0 = time.time()
    model = stages.train(data, recipe, on_line=quiet)
    return model, round((time.time() - t0) / 60, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--perturb", default="obs_noise,action_noise,actuator_gain")
    ap.add_argument("--latency", default="measured,50,100,200")
    ap.add_argument("--prefetch", type=int, default=0, help="also play each latency as a robot loop with prefetch")
    ap.add_argument("--demos", type=int, help="demonstrations to record (default: the demo's 512)")
    ap.add_argument("--steps", type=int, help="training steps (default: the demo's 1,200)")
    ap.add_argument("--work", help="keep everything here (default: a temporary folder)")
    ap.add_argument("--preset", choices=("demo", "so101"), default="demo", help="whose recipe and task")
    ap.add_argument("--model", help="evaluate this model instead of recording and training the preset's")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="roboloop-robustness-")).absolute()
    os.environ["ROBOLOOP_ARTIFACTS"] = str(work / "artifacts")
    os.environ["ROBOLOOP_CACHE_DIR"] = str(work / "cache")

    from roboloop import stages
    from roboloop.loop import presets

    base = getattr(presets, args.preset)()
    recipe = base.train.model_copy(update={"steps": args.steps} if args.steps else {})
    model, train_min = (args.model, None) if args.model else train_preset(base, recipe, args.demos, work)
    ev = base.eval.model_copy(update={"episodes": args.episodes, "num_envs": min(16, args.episodes), "videos": 0,
                                      "perturb": args.perturb or None, "latency": args.latency or None,
                                      "prefetch": args.prefetch})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"bench": "robustness", "date": time.strftime("%Y-%m-%d"), "commit": commit, "task": ev.task,
           "episodes": args.episodes, "train_minutes": train_min, "steps": None if args.model else recipe.steps,
           "preset": args.preset, "model": args.model}
    for who, policy in (("policy", model), ("expert", "expert")):
        out[who] = brief(stages.evaluate(policy, ev, on_line=lambda line: None))
        print(json.dumps({who: out[who]}), flush=True)
    emit(out, MEASURES)


if __name__ == "__main__":
    main()
