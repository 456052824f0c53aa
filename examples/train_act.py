"""Bring a LeRobot dataset and train LeRobot's ACT on it with roboloop's engine, then score it on the episodes it held
out against the trivial predictors (for data with no simulator twin).

    .venv/bin/python examples/train_act.py DATASET [--steps 2000] [--out runs/act]

DATASET is a folder (LeRobot v2.0, v2.1 or v3) or s3://bucket/prefix. A v2.x dataset is converted to v3 once (the
conversion is cached by the source's md5); the source is only read. The model folder is what LeRobot's
`save_pretrained` writes (`ACTPolicy.from_pretrained(OUT)` reads it), with roboloop's metadata beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from roboloop import stages
from roboloop.datasets.config import ConvertConfig
from roboloop.evaluation.config import OfflineRecipe
from roboloop.training.config import TrainRecipe


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", help="a LeRobot dataset folder or s3:// prefix")
    ap.add_argument("--out", default="runs/act", help="the model folder (a fresh one, or this run's to resume)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=8, help="samples per step")
    ap.add_argument("--act", default="{}", help="ACTConfig options as JSON, e.g. '{\"chunk_size\": 50}'")
    args = ap.parse_args(argv)

    # 1. validate (every defect named: file, episode, field) and convert a v2.x dataset to v3
    raw = stages.ingest(args.dataset)
    data = stages.convert(raw, ConvertConfig())
    print(f"dataset: {data.num_episodes} episodes, {data.num_frames} frames at {data.fps} fps ({raw.format} read, "
          f"trained on {data.path})", file=sys.stderr)

    # 2. LeRobot's ACT with LeRobot's ACT optimiser settings, a quarter of the episodes held out
    recipe = TrainRecipe(family="lerobot", policy_type="act", policy_config=json.loads(args.act), steps=args.steps,
                         max_samples=args.batch, lr=1e-5, weight_decay=1e-4, grad_clip=10.0, warmup_steps=0,
                         lr_schedule="constant", val_fraction=0.25, checkpoint_every_steps=max(args.steps // 4, 1))
    model = stages.train(data, recipe, output_dir=args.out, in_process=True)

    # 3. its action chunks against the recorded ones on the held-out episodes, beside the trivial predictors
    scored = stages.evaluate_offline(model, data, OfflineRecipe(), runs_root=Path(args.out).parent / "evals")
    result = {"model": model.path, "final_loss": model.metrics.get("final_loss"),
              "held_out_episodes": scored.episodes, "mse_norm": scored.mse_norm,
              "baselines": {name: b["mse_norm"] for name, b in scored.baselines.items()}, "scores": scored.run_dir}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
