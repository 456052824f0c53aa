"""Register a model trained outside the loop (a `lerobot-train` checkpoint's pretrained_model folder, or a roboloop
model folder) and let the promotion gate decide whether it becomes the champion.

    .venv/bin/python examples/register_checkpoint.py CHECKPOINT --dataset DATASET [--name my-act] [--registry DIR]

The version is scored offline on DATASET (the dataset it was trained on): its action chunks against the recorded
ones, episode by episode. With no champion yet it must beat the better trivial predictor (the mean action, the
previous action) on the same episodes; with one, it must be shown not worse than the champion, paired by episode.
The registry keeps the folder's weights, the lineage read from it (its config, metrics, dataset) and the decision.
"""

from __future__ import annotations

import argparse
import json

from roboloop.loop.registry_add import register_folder
from roboloop.registry import Registry, default_uri


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="e.g. outputs/train/.../checkpoints/020000/pretrained_model")
    ap.add_argument("--dataset", required=True, help="the LeRobot v3 dataset the model was trained on")
    ap.add_argument("--name", default="my-act", help="the registry's name for this line of models")
    ap.add_argument("--registry", default=None, help="a folder or s3:// URI (default: the project's)")
    args = ap.parse_args(argv)

    # scored on every episode (a lerobot-train run records no held-out split), then gated
    decision = register_folder(args.checkpoint, args.name, args.registry, dataset=args.dataset,
                               score_offline="all", promote=True)
    lineage = Registry(args.registry or default_uri()).lineage(args.name, decision.version)
    result = {"name": args.name, "version": decision.version, "promoted": decision.promoted,
              "reason": decision.reason, "champion": decision.champion, "trained_by": lineage["config"]["train"].get(
                  "trained_by", "roboloop"), "mse_norm": lineage["offline_eval"]["mse_norm"]}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
