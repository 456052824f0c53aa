"""A training run's kept checkpoints as model folders: which ones are finished, and one exported beside the run
(`model.safetensors` from its weights, the run's metadata with `checkpoint_step` recorded), never inside it.

The checkpoint sweep, the loop's pick among a run's checkpoints and `roboloop reproduce` of a picked version use
these; torch is imported only when a checkpoint is read (flows import the sweep's module).
"""

from __future__ import annotations

import json
from pathlib import Path

from roboloop import fsutil

NOT_MODEL_FILES = {"run_config.json", "heartbeat.json", "train_config.json", fsutil.MARKER}


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
    from roboloop.training.ema import averaged

    state = checkpoint.load(ckpt)
    # a run with ema_decay: the checkpoint's weight average, as the run's final model holds it
    weights = {k.removeprefix("module."): v.contiguous() for k, v in averaged(state["model"], state.get("ema")).items()}
    with fsutil.atomic_dir(dst, "model", overwrite=True, meta={"checkpoint_step": step, "run": run.name}) as tmp:
        for meta_file in run.iterdir():  # the run's metadata (its family's files among them), not logs or weights
            if meta_file.is_file() and meta_file.suffix == ".json" and meta_file.name not in NOT_MODEL_FILES:
                meta = json.loads(meta_file.read_text())
                if meta_file.name in (POLICY_FILE, "config.json"):
                    meta["checkpoint_step"] = step
                (tmp / meta_file.name).write_text(json.dumps(meta, indent=1))
        fsutil.save_safetensors(weights, tmp / "model.safetensors")
    return dst
