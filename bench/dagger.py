"""DAgger rounds: success per round (CPU), from a deliberately weak start on the reach task or from a trained
SO-101 model.

    python bench/dagger.py [--demos 16] [--rounds 3] [--episodes 96] [--round-episodes 64]
    python bench/dagger.py --preset so101 --source DEMOS --start MODEL [--train '{"val_fraction": 0.1}']
                           [--rounds 1] [--round-episodes 128] [--round-steps 500] [--round-lr 1e-4]
                           [--round-warmup 100] [--control] [--no-select]

Round 0 trains the preset's recipe on `--demos` scripted demonstrations (the demo preset: 16, deliberately
few), or with `--start` takes that model folder as round 0's (it must have been trained on `--source` with
the preset's recipe, e.g. by `bench/sweep.py --preset so101`, whose DIR/demos and final model these are);
each later round lets the current policy act for `--round-episodes` episodes, has the scripted expert label
every state it visited, aggregates those labels with the data so far as a new dataset version, continues
training from the previous weights for `--round-steps` and evaluates on `--episodes` test-split episodes
(Wilson 95% CI; the same episodes every round). Runs the loop itself (`roboloop.loop.run_loop` with the
library's stages, what `roboloop loop` runs) in a scratch folder. Ends with one JSON line: success_by_round,
ci_by_round, episodes_by_round, gain (last - first), minutes.
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
MEASURES = ["bench/dagger.py", "roboloop", "data.dvc"]


def steps_class():
    from roboloop.loop.run import LocalSteps

    class StartFrom(LocalSteps):
        """The library's stages, except that round 0's training is `start`'s model when one is given, and that with
        `control` a round records nothing and continues training on the data it has (the fine-tune alone)."""

        def __init__(self, start: str | None, control: bool = False, **kw):
            super().__init__(**kw)
            self.start, self.control = start, control

        def dagger_collect(self, model, recipe, round_, track):
            return None if self.control else super().dagger_collect(model, recipe, round_, track)

        def aggregate(self, sources, round_, track):
            return sources[0] if self.control else super().aggregate(sources, round_, track)

        def train(self, data, recipe, launch, track, execution):
            if self.start and recipe.init_from is None:
                from roboloop import stages

                return stages.model_ref(self.start, data.md5, execution, track)
            return super().train(data, recipe, launch, track, execution)

    return StartFrom


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="demo", choices=["demo", "so101"])
    ap.add_argument("--demos", type=int, help="demonstrations recorded for round 0 (default: 16; so101: the "
                    "preset's)")
    ap.add_argument("--source", help="demonstrations already recorded (default: WORK/demos, recorded if missing)")
    ap.add_argument("--start", help="round 0's model: a folder trained on --source with the preset's recipe")
    ap.add_argument("--train", type=json.loads, default={}, help="JSON: TrainRecipe fields to change from the "
                    "preset's (with --start: what it was trained with, e.g. '{\"val_fraction\": 0.1}')")
    ap.add_argument("--round-envs", type=int, help="vectorised envs while collecting a round (default: 32, "
                    "so101: the preset's)")
    ap.add_argument("--round-lr", type=float, default=5e-4, help="peak learning rate of a round's training")
    ap.add_argument("--round-warmup", type=int, default=0, help="warm-up steps of a round's training")
    ap.add_argument("--control", action="store_true", help="rounds record nothing and continue training on the "
                    "demonstrations alone, with the same schedule (what the rounds' data adds is the difference)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=96, help="evaluation episodes per round")
    ap.add_argument("--round-episodes", type=int, default=64, help="policy rollouts labelled per round")
    ap.add_argument("--steps", type=int, help="round-0 training steps (default: 600; so101: the preset's)")
    ap.add_argument("--round-steps", type=int, default=400, help="continued-training steps per round")
    ap.add_argument("--work", help="keep everything here (default: a temporary folder)")
    ap.add_argument("--no-select", action="store_true", help="skip the preset's checkpoint pick (so101: when "
                    "--start is the model its loop already picked)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="roboloop-dagger-")).absolute()
    os.environ["ROBOLOOP_ARTIFACTS"] = str(work / "artifacts")
    os.environ["ROBOLOOP_CACHE_DIR"] = str(work / "cache")
    os.environ["ROBOLOOP_REGISTRY"] = str(work / "registry")

    from roboloop.evaluation.config import CollectConfig, EvalRecipe
    from roboloop.loop import PRESETS, DaggerConfig, LoopConfig, run_loop

    base = PRESETS[args.preset]()
    if args.preset == "demo":  # a deliberately weak start (what docs/guides/dagger-and-rl.md's reach rows ran)
        collect = CollectConfig(episodes=args.demos or 16, num_envs=min(16, args.demos or 16), noise=0.5)
        ev = EvalRecipe(episodes=args.episodes, num_envs=min(16, args.episodes),
                        execute_steps=base.eval.execute_steps, videos=0)
    else:
        collect = base.collect_if_missing
        assert collect is not None
        if args.demos:
            collect = collect.model_copy(update={"episodes": args.demos, "num_envs": min(collect.num_envs,
                                                                                          args.demos)})
        ev = base.eval.model_copy(update={"episodes": args.episodes, "num_envs": min(16, args.episodes),
                                          "videos": 0})
    round_envs = args.round_envs or (min(32, args.round_episodes) if args.preset == "demo" else collect.num_envs)
    steps = args.steps or (600 if args.preset == "demo" else base.train.steps)
    train = {**base.train.model_dump(), "steps": steps, **args.train}
    # the loop itself (roboloop.loop.run_loop)
    cfg = LoopConfig.model_validate({**base.model_dump(), **{
        "source": str(Path(args.source).absolute() if args.source else work / "demos"),
        "model_name": "dagger-bench", "track": False, "baseline": False, "rounds": args.rounds + 1,
        **({"select": None} if args.no_select else {}),
        "collect_if_missing": collect, "train": train, "eval": ev,
        "dagger": DaggerConfig(episodes=args.round_episodes, num_envs=round_envs, steps=args.round_steps,
                               lr=args.round_lr, warmup_steps=args.round_warmup)}})
    t0 = time.time()
    StartFrom = steps_class()
    s = run_loop(cfg, StartFrom(args.start, args.control, on_line=lambda line: None))
    for r in s.rounds:
        print(json.dumps({"round": r.round, "episodes": r.episodes, "success": r.success_rate,
                          "ci": [round(r.ci_low, 3), round(r.ci_high, 3)]}), flush=True)
    success = [r.success_rate for r in s.rounds]
    emit({"bench": "dagger", "preset": args.preset, "start": args.start, "control": args.control,
          "success_by_round": success,
          "ci_by_round": [[round(r.ci_low, 3), round(r.ci_high, 3)] for r in s.rounds],
          "episodes_by_round": [r.episodes for r in s.rounds], "gain": round(success[-1] - success[0], 3),
          "eval_episodes": args.episodes, "minutes": round((time.time() - t0) / 60, 1),
          "work": str(work)}, MEASURES)


if __name__ == "__main__":
    main()
