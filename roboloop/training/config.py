"""Typed training configuration: one pydantic model for the CLI, the flows and torchrun ranks.

Presets are functions (torchtitan style); variants derive from a base by changing fields.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

BYTE_VOCAB = 259  # 256 bytes + pad, bos, eos


class ModelConfig(BaseModel):
    image_size: tuple[int, int] = Field((64, 64), description="(H, W) images are resized to")
    patch_size: int = Field(16, gt=0)
    max_cameras: int = Field(4, gt=0)
    vocab_size: int = BYTE_VOCAB
    max_text_len: int = Field(96, gt=0, description="instruction tokens kept (bytes by default)")
    state_dim: int = Field(6, gt=0)
    action_dim: int = Field(6, gt=0)
    horizon: int = Field(16, gt=0, description="action chunk length H")
    dim: int = Field(128, gt=0, description="backbone width")
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    head_dim_model: int = Field(128, gt=0, description="action-head (DiT) width")
    head_layers: int = Field(2, ge=1)
    head_heads: int = Field(4, ge=1)
    head_head_dim: int | None = Field(None, description="per-head dim of the DiT (GR00T: 48)")
    inference_steps: int = Field(4, ge=1, description="Euler steps K at inference")
    attention: Literal["auto", "flash", "torch_varlen", "sdpa"] = "auto"

    @property
    def tokens_per_image(self) -> int:
        h, w = self.image_size
        return (h // self.patch_size) * (w // self.patch_size)


def tiny(**kw) -> ModelConfig:
    """CPU-sized: learns a small task in minutes."""
    return ModelConfig(**{"image_size": (64, 64), "patch_size": 16, "dim": 96, "layers": 2, "heads": 4,
                          "head_dim_model": 96, "head_layers": 2, "head_heads": 4, **kw})


def small(**kw) -> ModelConfig:
    return ModelConfig(**{"image_size": (128, 128), "patch_size": 16, "dim": 384, "layers": 6, "heads": 6,
                          "head_dim_model": 384, "head_layers": 6, "head_heads": 6, **kw})


def base(**kw) -> ModelConfig:
    """~1B parameters: where FP8 pays off on Hopper."""
    return ModelConfig(**{"image_size": (224, 224), "patch_size": 14, "dim": 2048, "layers": 4, "heads": 16,
                          "head_dim_model": 1536, "head_layers": 16, "head_heads": 32, "head_head_dim": 48, **kw})


def n15(**kw) -> ModelConfig:
    """GR00T-N1.5's action-head dimensions: 16 DiT layers, 1536 wide, 32 heads x 48, horizon 16."""
    return ModelConfig(**{"image_size": (224, 224), "patch_size": 14, "dim": 2048, "layers": 12, "heads": 16,
                          "head_dim_model": 1536, "head_layers": 16, "head_heads": 32, "head_head_dim": 48,
                          "horizon": 16, **kw})


PRESETS = {"tiny": tiny, "small": small, "base": base, "n15": n15}
