"""What the pipeline's policies reach at the demo's budget: collect -> train -> evaluate on both reach tasks.

    python bench/policy.py [--episodes 96] [--skip-vision | --skip-state] [--vision-steps N]
                           [--vision-model '{"aux_to_state": 0}'] [--vision-recipe '{"aux_weight": 0.3}']
                           [--state-model '{"horizon": 8}'] [--state-recipe '{"lr": 5e-4}']
                           [--collect '{"instructions_per_layout": 1}'] [--eval-seed 7]
                           [--state-task Roboloop-Reach-Red-v0 --state-recipe '{"family": "lerobot",
                            "policy_type": "act"}']   # LeRobot's ACT at the demo's budget

Every ablation row of docs/guides/recipes.md is one command line of this script (the page gives each).

State task (`Roboloop-Reach-Color-v0`): the `make demo` recipe exactly (512 DART-noise demonstrations,
state + language, 1,200 steps of 128 samples). Vision task (`Roboloop-Reach-Color-Vision-v0`, ball
positions only in the camera image): the `vision` loop preset (`roboloop.loop.vision`: the same
recording with the camera and the privileged ball positions, a keypoint encoder, an auxiliary target
whose prediction also feeds the state token).
Each policy, the scripted expert and a random policy are evaluated on the same `--episodes`
test-split episodes (Wilson 95% CI). Ends with one JSON line: state_success, state_ci_low,
vision_success, vision_ci_low, expert_success, random_success, train_minutes, vision_train_minutes.
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
MEASURES = ["bench/policy.py", "roboloop"]


def recipe_over(base, update: dict, model: dict):
    """`base` (the demo's recipe) with `update` and `model` merged into its model overrides (their `horizon` is a
    LeRobot ACT's chunk too). A LeRobot policy does not keep the VLA's token budget (`max_tokens`): the training
    config refuses it, since it would do nothing."""
    from roboloop.training.config import TrainRecipe

    data = {**base.model_dump(), **update, "model_overrides": {**base.model_overrides, **model}}
    if data["family"] == "lerobot":
        data.pop("max_tokens")
    return TrainRecipe.model_validate(data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=96)
    ap.add_argument("--skip-vision", action="store_true")
    ap.add_argument("--skip-state", action="store_true")
    ap.add_argument("--vision-steps", type=int, help="default: the vision preset's")
    ap.add_argument("--vision-model", default="{}", help="JSON of ModelConfig fields to change in the vision preset")
    ap.add_argument("--vision-recipe", default="{}", help="JSON of TrainRecipe fields to change in the vision preset "
                    "(e.g. {\"aux_target\": null} with --vision-model '{\"aux_to_state\": 0}' for the ablation "
                    "without the auxiliary target)")
    ap.add_argument("--work", help="keep everything here (default: a temporary folder)")
    ap.add_argument("--demos", type=int, help="demonstrations to record (default: the presets'; fewer for a smoke run)")
    ap.add_argument("--steps", type=int, help="training steps of both recipes (default: the presets')")
    ap.add_argument("--state-model", default="{}", help="JSON of ModelConfig fields to change in the demo recipe "
                    "(e.g. '{\"state_encoder\": \"per_dim\"}', '{\"horizon\": 8}')")
    ap.add_argument("--state-recipe", default="{}", help="JSON of TrainRecipe fields to change in the demo recipe")
    ap.add_argument("--collect", default="{}", help="JSON of CollectConfig fields to change in both recordings "
                    "(e.g. '{\"instructions_per_layout\": 1}', '{\"noise\": 0}')")
    ap.add_argument("--eval-seed", type=int, help="seed of the test-split layouts (default: EvalRecipe's)")
    ap.add_argument("--state-task", default="Roboloop-Reach-Color-v0",
                    help="the state row's task; Roboloop-Reach-Red-v0 (one instruction, recorded with one per layout) "
                    "for policies that do not read language, e.g. --state-recipe '{\"family\": \"lerobot\", "
                    "\"policy_type\": \"act\"}'")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="roboloop-policy-")).absolute()
    os.environ["ROBOLOOP_ARTIFACTS"] = str(work / "artifacts")
    os.environ["ROBOLOOP_CACHE_DIR"] = str(work / "cache")

    from roboloop import stages
    from roboloop.datasets.config import ConvertConfig
    from roboloop.evaluation.config import EvalRecipe
    from roboloop.loop import demo, vision

    quiet = lambda line: None  # noqa: E731
    base = demo()
    out: dict = {"bench": "policy", "eval_episodes": args.episodes}

    def run(task: str, recipe, prefix: str, collect) -> None:
        ev = EvalRecipe(task=task, episodes=args.episodes, num_envs=min(16, args.episodes),
                        execute_steps=base.eval.execute_steps, videos=0,
                        **({"seed": args.eval_seed} if args.eval_seed is not None else {}))
        raw = stages.ingest(str(work / f"demos-{prefix}"), collect=collect, on_line=quiet)
        data = stages.convert(raw, ConvertConfig(progress=False))
        t0 = time.time()
        model = stages.train(data, recipe, on_line=quiet)
        out[f"{prefix}train_minutes"] = round((time.time() - t0) / 60, 2)
        s = stages.evaluate(model, ev, on_line=quiet)
        out[f"{prefix}success"], out[f"{prefix}ci_low"] = s.success_rate, round(s.ci_low, 3)
        for who in ("expert", "random"):
            out[f"{prefix}{who}_success"] = stages.evaluate(who, ev, on_line=quiet).success_rate
        print(json.dumps({k: v for k, v in out.items() if k.startswith(prefix)}), flush=True)

    def smaller(collect):
        collect = collect.model_copy(update=json.loads(args.collect))
        if not args.demos:
            return collect
        return collect.model_copy(update={"episodes": args.demos, "num_envs": min(collect.num_envs, args.demos)})

    if not args.skip_state:
        state_recipe = recipe_over(base.train, {**({"steps": args.steps} if args.steps else {}),
                                                **json.loads(args.state_recipe)}, json.loads(args.state_model))
        out["state_recipe"] = state_recipe.model_dump(mode="json", exclude_defaults=True)
        collect = base.collect_if_missing.model_copy(update={"task": args.state_task, **(
            {"instructions_per_layout": 1} if args.state_task == "Roboloop-Reach-Red-v0" else {})})
        out["state_task"] = args.state_task
        run(args.state_task, state_recipe, "state_", smaller(collect))
    if not args.skip_vision:
        v = vision()
        steps = args.vision_steps or args.steps
        recipe = v.train.model_copy(update={**({"steps": steps} if steps else {}),
                                            **json.loads(args.vision_recipe),
                                            "model_overrides": {**v.train.model_overrides,
                                                                **json.loads(args.vision_model)}})
        out["vision_recipe"] = recipe.model_dump(mode="json", exclude_defaults=True)
        run(v.eval.task, recipe, "vision_", smaller(v.collect_if_missing))
    out["random_success"] = out.get("state_random_success")
    out["expert_success"] = out.get("state_expert_success")
    out["train_minutes"] = out.get("state_train_minutes")
    emit(out, MEASURES)


if __name__ == "__main__":
    main()
