"""What a training run says about its data in its log, and the files it finishes with (the model folder's metadata,
stats and plot first, the weights last)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from roboloop import fsutil, policies
from roboloop.datasets.layout import ENV_STATE
from roboloop.errors import DiskFullError
from roboloop.training import metrics
from roboloop.training.config import TrainConfig
from roboloop.training.data import V3Dataset


def camera_line(ds: V3Dataset, with_video: bool, wanted: tuple[str, ...] | None = None) -> str:
    """The run log's word on cameras: which the model sees, and any the dataset has that it does not."""
    if not ds.cameras:
        return "cameras: none in this dataset (state + language only)"

    def kinds(cams) -> str:
        return ", ".join(f"{c.key} ({'depth ' if c.depth else ''}{c.storage}, {c.height}x{c.width})" for c in cams)

    if not with_video:
        return f"cameras: NOT USED (with_video=False); the dataset has {kinds(ds.cameras)}"
    skipped = [c for c in ds.cameras if wanted is not None and c.key not in wanted]
    fed = [c for c in ds.cameras if c not in skipped]
    return f"cameras: {kinds(fed)}" + (f"; NOT USED by this policy family: {kinds(skipped)}" if skipped else "")


def sample_order(cfg: TrainConfig, with_video: bool) -> str:
    """The order `cfg.sample_order` means for this run (auto: lerobot-train's uniform order when no camera is fed;
    the windows that decode video sequentially otherwise). A `shuffle_buffer` other than its default is refused
    when the order is uniform: a permutation of every frame has no buffer, so the setting would do nothing."""
    order = cfg.sample_order if cfg.sample_order != "auto" else "windows" if with_video else "uniform"
    default = type(cfg).model_fields["shuffle_buffer"].default
    if order == "uniform" and cfg.shuffle_buffer != default:
        why = "sample_order uniform" if cfg.sample_order == "uniform" else "sample_order auto, no camera fed"
        raise ValueError(f"shuffle_buffer {cfg.shuffle_buffer}: this run draws each epoch as one permutation of the "
                         f"split's frames ({why}), which has no shuffle buffer; set sample_order windows to mix "
                         f"windows in one, or leave shuffle_buffer at {default}")
    return order


def env_state_line(ds: V3Dataset, read: bool, setting: str) -> str:
    """The run log's word on observation.environment_state, for a family that can read it."""
    if read:
        return (f"environment state: {ENV_STATE} ({ds.env_state.shape[1]} values) is an input "  # type: ignore[union-attr]
                f"(env_state_input {setting}): acting needs it at every step")
    return f"environment state: {ENV_STATE} NOT USED (env_state_input {setting})"


def init_depth_ranges(init: Path) -> dict[str, tuple[float, float]]:
    return {c["key"]: tuple(c["depth_mm"]) for c in policies.model_info(init).cameras if c.get("depth_mm")}


def features_of(ds: V3Dataset, with_video: bool) -> policies.Features:
    return policies.Features(ds.state_key, ds.action_key, int(ds.state.shape[1]), int(ds.action.shape[1]),
                             tuple(c.describe() for c in ds.cameras) if with_video else (), float(ds.meta.info.fps),
                             int(ds.aux.shape[1]) if ds.aux is not None else 0,
                             {k: {s: np.asarray(v).tolist() for s, v in d.items()}
                              for k, d in ds.meta.dataset_stats().items()},
                             int(ds.env_state.shape[1]) if ds.env_state is not None else 0)


def save_final(out: Path, weights: dict[str, torch.Tensor], family, trainable, cfg: TrainConfig, ds: V3Dataset,
               stats: dict, split: dict, depth_mm: dict[str, tuple[float, float]] | None = None,
               with_video: bool = True, run_record: dict | None = None) -> None:
    """The family's files, stats and plot first, the weights last: `model.safetensors` existing means the run
    finished."""
    depth_mm = depth_mm or {}
    wanted = trainable.needs.camera_keys  # the cameras this family reads (None: all)
    fed = [c for c in ds.cameras if with_video and (wanted is None or c.key in wanted)]
    used = [{**c.describe(), **({"depth_mm": list(depth_mm[c.key])} if c.key in depth_mm else {})} for c in fed]
    data: dict = {"state_key": ds.state_key, "action_key": ds.action_key, "camera_keys": [c["key"] for c in used],
                  "cameras": used, "cameras_not_used": [c.describe() for c in ds.cameras if c not in fed],
                  "fps": ds.meta.info.fps, "with_video": with_video}
    info = policies.ModelInfo(cfg.family, ds.state_key, ds.action_key, int(ds.state.shape[1]),
                              int(ds.action.shape[1]), trainable.needs.horizon, data["camera_keys"], used,
                              cfg.model_dump(mode="json"), split, runtime=run_record or {})
    family.write_meta(out, trainable, info, data)
    fsutil.atomic_write_json(out / policies.POLICY_FILE, info.to_json())
    fsutil.atomic_write_json(out / "stats.json", stats)
    metrics.plot_loss(out / "metrics.jsonl", out / "loss.png")
    tmp = fsutil.temp_sibling(out / policies.WEIGHTS_FILE)
    try:
        fsutil.save_safetensors(weights, tmp)
        os.replace(tmp, out / policies.WEIGHTS_FILE)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        if "code: 28" in str(e) or "No space left" in str(e):  # safetensors wraps the OS error in its own type
            raise DiskFullError(f"no space left on the device while writing {out / 'model.safetensors'}; the run's "
                                "checkpoints are kept: free space and rerun to finish") from e
        raise

