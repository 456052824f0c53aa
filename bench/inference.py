"""Which inference settings should a trained VLA act with? The same weights on the same episodes under each.

    python bench/inference.py MODEL [MODEL ...] [--task Roboloop-SO101-PickCube-v0] [--episodes 48] [--seed 1]
                              [--variants base zero k2 k8 e2 e6] [--num-envs 16] [--work DIR]
    python bench/inference.py --preset demo --demos 4 --steps 3 ...   # no MODEL: record and train the preset first

Variants of each model:
- `base`: the model as it is (its config.json's `inference_steps` and `initial_noise`; 4 chunk actions executed
  before re-planning, `--execute-steps`): the baseline every other variant is paired with;
- `zero`: the denoising starts at x_0 = 0, the flow's centre, instead of a draw from N(0, I);
- `kN`: N Euler steps of the denoising instead of the model's;
- `eN`: N actions of each predicted chunk executed before re-planning.
A `zero`/`kN` variant is a folder under --work holding the model's files (the weights a symlink) with
config.json changed, which is what a user edits to run a model so; each runs through `stages.evaluate` (cached
on the weights and config.json). Pick settings on validation episodes (`--seed 1`, as the `so101` preset picks
its checkpoint), never on the test episodes results are reported on (seed 0). Prints one JSON line per model and
variant, then one with each variant's successes over all models and its paired difference from `base`, pooled
over the models with the interval clustered by episode (as `roboloop compare` pools several pairs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/inference.py", "roboloop/policies", "roboloop/evaluation"]


def variant_folder(model: Path, variant: str, work: Path) -> tuple[Path, int | None]:
    """(model folder to evaluate, execute_steps or None) for one variant."""
    if variant == "base":
        return model, None
    if m := re.fullmatch(r"e(\d+)", variant):
        return model, int(m.group(1))
    if variant == "zero":
        change: dict = {"initial_noise": "zero"}
    elif m := re.fullmatch(r"k(\d+)", variant):
        change = {"inference_steps": int(m.group(1))}
    else:
        raise SystemExit(f"unknown variant {variant!r}: base, zero, kN (Euler steps) or eN (actions executed)")
    conf = json.loads((model / "config.json").read_text())
    if "model" not in conf:
        raise SystemExit(f"{model}: not a roboloop VLA folder (its config.json has no model): {variant} needs one")
    out = work / "variants" / f"{model.name}-{model.parent.name}-{variant}"
    out.mkdir(parents=True, exist_ok=True)
    for f in model.iterdir():
        if f.is_file() and f.name != "config.json" and not (out / f.name).exists():
            os.symlink(f.absolute(), out / f.name)
    conf["model"].update(change)
    (out / "config.json").write_text(json.dumps(conf))
    return out, None


def trained(args: argparse.Namespace, work: Path) -> tuple[list[Path], str, int]:
    """Record and train the preset's recipe (when no model is given): (models, its task, its execute_steps)."""
    from roboloop import stages
    from roboloop.datasets.config import ConvertConfig
    from roboloop.loop import PRESETS

    cfg = PRESETS[args.preset]()
    collect = cfg.collect_if_missing
    assert collect is not None
    if args.demos:
        collect = collect.model_copy(update={"episodes": args.demos, "num_envs": min(collect.num_envs, args.demos)})
    recipe = cfg.train.model_copy(update={"steps": args.steps} if args.steps else {})
    quiet = lambda line: None  # noqa: E731
    data = stages.convert(stages.ingest(str(work / "demos"), collect=collect, on_line=quiet),
                          ConvertConfig(progress=False))
    return [Path(stages.train(data, recipe, on_line=quiet).path)], cfg.eval.task, cfg.eval.execute_steps or 4


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", help="roboloop VLA model folders (e.g. one per training seed)")
    ap.add_argument("--task", help="default: Roboloop-SO101-PickCube-v0, or the preset's when no MODEL is given")
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1, help="1: validation episodes; results are reported on seed 0")
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--execute-steps", type=int, default=4, help="the base variant's (and kN's, zero's); without "
                    "MODEL: the preset's")
    ap.add_argument("--variants", nargs="+", default=["base", "zero", "k2", "k8", "e2", "e6"])
    ap.add_argument("--preset", default="demo", help="without MODEL: record and train this preset's recipe")
    ap.add_argument("--demos", type=int, help="without MODEL: demonstrations to record (default: the preset's)")
    ap.add_argument("--steps", type=int, help="without MODEL: training steps (default: the preset's)")
    ap.add_argument("--work", help="variant folders, results and caches here (default: a temporary folder)")
    args = ap.parse_args()
    if "base" not in args.variants:
        args.variants.insert(0, "base")
    work = Path(args.work or tempfile.mkdtemp(prefix="roboloop-inference-")).absolute()
    os.environ.setdefault("ROBOLOOP_ARTIFACTS", str(work / "artifacts"))
    os.environ.setdefault("ROBOLOOP_CACHE_DIR", str(work / "cache"))

    from roboloop import stages
    from roboloop.binomial import pooled_paired_difference
    from roboloop.cache import ReceiptCache
    from roboloop.evaluation.config import EvalRecipe

    models, task, execute = [Path(m).absolute() for m in args.models], args.task, args.execute_steps
    if not models:
        models, preset_task, execute = trained(args, work)
        task = task or preset_task
    task = task or "Roboloop-SO101-PickCube-v0"
    cache = ReceiptCache()
    outcomes: dict[str, list[dict[int, bool]]] = {v: [] for v in args.variants}
    for model in models:
        for variant in args.variants:
            folder, steps = variant_folder(model, variant, work)
            recipe = EvalRecipe(task=task, episodes=args.episodes, num_envs=min(args.num_envs, args.episodes),
                                seed=args.seed, execute_steps=steps or execute, videos=0)
            e = stages.evaluate(str(folder), recipe, cache=cache, on_line=lambda line: None)
            if e.outcomes is None:
                raise SystemExit(f"{e.run_dir}: the report does not number its episodes")
            outcomes[variant].append({i: c == "1" for i, c in enumerate(e.outcomes)})
            print(json.dumps({"model": str(model), "variant": variant, "successes": e.successes,
                              "episodes": e.episodes, "run_dir": e.run_dir}), flush=True)
    rows = {}
    for variant in args.variants:
        row: dict = {"successes": sum(sum(o.values()) for o in outcomes[variant]),
                     "episodes": sum(len(o) for o in outcomes[variant])}
        if variant != "base":  # all models share the task and seed: one cluster per episode number
            d = pooled_paired_difference([(o, b, (task, args.seed)) for o, b in
                                          zip(outcomes[variant], outcomes["base"], strict=True)])
            row["minus_base"] = {k: d[k] for k in ("diff", "ci_low", "ci_high", "discordant")}
        rows[variant] = row
    emit({"bench": "inference", "baseline": "base: each model's own settings", "task": task,
          "seed": args.seed, "models": len(models), "variants": rows}, MEASURES)


if __name__ == "__main__":
    main()
