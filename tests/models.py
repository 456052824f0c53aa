"""A randomly initialised tiny VLA saved as a `roboloop train` model folder: for the RL and serving tests, which
need a loadable policy but not a trained one."""

from __future__ import annotations

import json
from pathlib import Path


def untrained_model(path: Path, state_dim: int, action_dim: int, horizon: int, state_std: float = 1.0,
                    action_std: float = 1.0, cameras: tuple[str, ...] = (), seed: int = 0) -> Path:
    """`cameras`: the camera keys it reads (each resized to 64x64)."""
    import torch
    from safetensors.torch import save_file

    from roboloop.training.config import tiny
    from roboloop.training.model import VLAPolicy

    torch.manual_seed(seed)
    cfg = tiny(state_dim=state_dim, action_dim=action_dim, horizon=horizon)
    path.mkdir()
    save_file(VLAPolicy(cfg).state_dict(), str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model": cfg.model_dump(mode="json"), "train": {}, "data": {
        "state_key": "observation.state", "action_key": "action", "camera_keys": list(cameras),
        "with_video": bool(cameras)}}))
    (path / "stats.json").write_text(json.dumps({
        "observation.state": {"mean": [0.0] * state_dim, "std": [state_std] * state_dim},
        "action": {"mean": [0.0] * action_dim, "std": [action_std] * action_dim}}))
    return path
