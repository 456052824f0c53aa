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


def lerobot_act_model(path: Path, state_dim: int = 6, action_dim: int = 3, chunk: int = 5,
                      camera: str = "observation.images.front", seed: int = 0) -> Path:
    """A randomly initialised tiny ACT saved by LeRobot's own `save_pretrained` (config.json, model.safetensors and
    its processor files), as a `lerobot-train` checkpoint's pretrained_model folder is: a LeRobot-family folder."""
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    torch.manual_seed(seed)
    cfg = ACTConfig(input_features={"observation.state": PolicyFeature(FeatureType.STATE, (state_dim,)),
                                    camera: PolicyFeature(FeatureType.VISUAL, (3, 32, 32))},
                    output_features={"action": PolicyFeature(FeatureType.ACTION, (action_dim,))}, chunk_size=chunk,
                    n_action_steps=chunk, dim_model=32, dim_feedforward=64, n_encoder_layers=1, n_decoder_layers=1,
                    n_heads=2, latent_dim=8, pretrained_backbone_weights=None, device="cpu", push_to_hub=False)
    stats = {"observation.state": {"mean": torch.zeros(state_dim), "std": torch.ones(state_dim)},
             "action": {"mean": torch.zeros(action_dim), "std": torch.ones(action_dim)},
             camera: {"mean": torch.zeros(3, 1, 1), "std": torch.ones(3, 1, 1)}}
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    ACTPolicy(cfg).save_pretrained(path)
    pre.save_pretrained(path)
    post.save_pretrained(path)
    return path
