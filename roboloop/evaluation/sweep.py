"""Checkpoint sweeps: every kept checkpoint of a training run as a model folder, scored, the best chosen.

The final loss is a poor guide to closed-loop success (flow-matching loss keeps falling while
success plateaus or drops), so platforms score checkpoints in simulation. A checkpoint becomes
a model folder (`model.safetensors` from its weights, the run's `config.json` and `stats.json`,
`checkpoint_step` recorded) beside the run, never inside it; the run's own files are only read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from roboloop import fsutil

NOT_MODEL_FILES = {"run_config.json", "heartbeat.json", "train_config.json", fsutil.MARKER}


@dataclass
class Scored:
    step: int
    model: str
    success_rate: float
    ci_low: float
    ci_high: float
    successes: int
    episodes: int


def kept_checkpoints(run: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of the run's finished checkpoints, oldest first."""
    from roboloop.training import checkpoint  # torch: only when sweeping (flows import this module)

    out = []
    for p in checkpoint.complete(Path(run) / "checkpoints"):
        if checkpoint.is_sharded(p):
            raise ValueError(f"{p} is an FSDP (DCP) checkpoint: consolidate it first (torch.distributed.checkpoint "
                             "format_utils.dcp_to_torch_save) to sweep it")
        out.append((int(json.loads((p / "meta.json").read_text())["step"]), p))
    return out


def export_checkpoint(run: str | Path, ckpt: Path, step: int, dst: str | Path) -> Path:
    """A model folder at `dst` with the checkpoint's weights (an earlier export of the same step is reused)."""
    from roboloop.training import checkpoint

    run, dst = Path(run), Path(dst)
    from roboloop.policies import POLICY_FILE

    for f in (POLICY_FILE, "stats.json"):
        if not (run / f).is_file():
            raise FileNotFoundError(f"{run}: no {f}; sweep a finished run (its config and normalisation are needed)")
    if (dst / "model.safetensors").is_file() and (fsutil.read_marker(dst) or {}).get("checkpoint_step") == step:
        return dst
    state = checkpoint.load(ckpt)
    weights = {k.removeprefix("module."): v.contiguous() for k, v in state["model"].items()}
    with fsutil.atomic_dir(dst, "model", overwrite=True, meta={"checkpoint_step": step, "run": run.name}) as tmp:
        for meta_file in run.iterdir():  # the run's metadata (its family's files among them), not logs or weights
            if meta_file.is_file() and meta_file.suffix == ".json" and meta_file.name not in NOT_MODEL_FILES:
                meta = json.loads(meta_file.read_text())
                if meta_file.name in (POLICY_FILE, "config.json"):
                    meta["checkpoint_step"] = step
                (tmp / meta_file.name).write_text(json.dumps(meta, indent=1))
        fsutil.save_safetensors(weights, tmp / "model.safetensors")
    return dst


def best(scored: list[Scored]) -> Scored:
    """Highest success; ties go to the higher Wilson lower bound, then to the later step."""
    return max(scored, key=lambda s: (s.success_rate, s.ci_low, s.step))


def plot_sweep(scored: list[Scored], png: Path, title: str = "") -> Path:
    from roboloop import plots

    fig, ax = plots.subplots(figsize=(5.5, 3.2))
    plots.success_curve(ax, [s.step for s in scored], [s.success_rate for s in scored], [s.ci_low for s in scored],
                        [s.ci_high for s in scored])
    b = best(scored)
    ax.plot([b.step], [b.success_rate], "r*", ms=14, label=f"best: step {b.step}")
    ax.set_xlabel("training step")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return plots.save(fig, png)
