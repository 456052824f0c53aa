"""The optimizer step: roboloop's AdamW (`roboloop.training.optim`: PyTorch's fused kernel) against PyTorch's default
AdamW (on CPU a loop over the parameters, about ten small ops each; on CUDA its `foreach` default).

    python bench/optim.py [--models act act256 vla_tiny vla_small] [--steps 30] [--device cpu|cuda]

Models (their parameters, with random gradients; the step does not depend on their values):
- `act`: LeRobot's default ACT (dim 512, ResNet-18, VAE), what `roboloop train --policy-type act` builds;
- `act256`: the ACT of `bench/lerobot_train.py` (dim 256, 2 encoder layers, 1 decoder layer);
- `vla_tiny` / `vla_small`: roboloop's VLA presets (the demo trains `tiny`).
Median milliseconds per `opt.step()` over `--steps` after one warm-up, both with the same lr and weight decay, and
`ratio` = default / roboloop. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/optim.py", "roboloop/training"]


def build(name: str):
    import torch

    if name.startswith("vla"):
        from roboloop.training.config import PRESETS
        from roboloop.training.model import VLAPolicy

        return VLAPolicy(PRESETS[name.split("_")[1]](state_dim=16, action_dim=2, horizon=8))
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    small = {"dim_model": 256, "dim_feedforward": 1024, "n_encoder_layers": 2, "n_decoder_layers": 1} \
        if name == "act256" else {}
    torch.manual_seed(0)
    return ACTPolicy(ACTConfig(input_features={
        "observation.state": PolicyFeature(FeatureType.STATE, (6,)),
        "observation.images.front": PolicyFeature(FeatureType.VISUAL, (3, 96, 128))},
        output_features={"action": PolicyFeature(FeatureType.ACTION, (6,))}, pretrained_backbone_weights=None,
        device="cpu", **small))


def median_step_ms(opt, steps: int, device: str) -> float:
    import torch

    opt.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e3, 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["act", "act256", "vla_tiny", "vla_small"],
                    choices=["act", "act256", "vla_tiny", "vla_small"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    import torch

    from roboloop.training.optim import adamw

    rows = {}
    for name in args.models:
        model = build(name).to(args.device)
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.grad = torch.randn_like(p)
        default = torch.optim.AdamW(params, lr=1e-4, weight_decay=1e-4)
        ours, label = adamw(params, 1e-4, 1e-4)
        d, o = median_step_ms(default, args.steps, args.device), median_step_ms(ours, args.steps, args.device)
        rows[name] = {"parameters": len(params), "values_m": round(sum(p.numel() for p in params) / 1e6, 2),
                      "default_ms": d, "roboloop_ms": o, "roboloop_optimizer": label, "ratio": round(d / o, 2)}
        print(f"{name}: {len(params)} parameters, default {d} ms, roboloop {o} ms ({rows[name]['ratio']}x)",
              file=sys.stderr)
    emit({"device": args.device, "threads": torch.get_num_threads(), "steps": args.steps,
          "baseline": "torch.optim.AdamW with its defaults (same lr and weight decay)", "models": rows}, MEASURES)


if __name__ == "__main__":
    main()
