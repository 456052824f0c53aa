"""Optional Hugging Face components, from local folders only (no Hub access is ever attempted).

- a vision encoder: any `transformers` vision checkpoint whose model maps `pixel_values`
  to `last_hidden_state` (ViT, SigLIP/SigLIP2 vision towers, DINOv2, ...). Its patch tokens
  are pooled to the policy's `tokens_per_image` and projected to the backbone width, so
  packing and the rest of the model do not change.
- a tokenizer: any `transformers` tokenizer folder; instruction ids replace the byte tokens
  and the embedding table grows to its vocabulary.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - transformers ships with the sim extra
        raise ImportError("a Hugging Face vision encoder or tokenizer needs `transformers`: "
                          "pip install 'roboloop[sim]' or pip install transformers") from e
    return transformers


def _local_dir(path: str, what: str) -> Path:
    p = Path(path).expanduser()
    if not (p / "config.json").exists() and not (p / "tokenizer.json").exists() \
            and not (p / "tokenizer_config.json").exists():
        raise FileNotFoundError(f"{what} {path!r}: not a local Hugging Face folder (no config.json or "
                                "tokenizer files); download it first, roboloop never reaches the Hub")
    return p


@lru_cache(maxsize=8)
def load_tokenizer(path: str):
    tf = _transformers()
    return tf.AutoTokenizer.from_pretrained(str(_local_dir(path, "tokenizer")), local_files_only=True)


def tokenizer_vocab_size(path: str) -> int:
    return len(load_tokenizer(path))


def text_tokens(path: str, text: str, max_len: int) -> torch.Tensor:
    ids = load_tokenizer(path)(text, truncation=True, max_length=max_len)["input_ids"]
    if not ids:
        raise ValueError(f"tokenizer {path} produced no tokens for instruction {text!r}")
    return torch.tensor(ids, dtype=torch.long)


class HFVisionEncoder(nn.Module):
    """Local HF vision model -> (images, tokens_per_image, out_dim) tokens."""

    def __init__(self, path: str, out_dim: int, tokens_per_image: int):
        super().__init__()
        tf = _transformers()
        folder = _local_dir(path, "vision encoder")
        model = tf.AutoModel.from_pretrained(str(folder), local_files_only=True)
        self.model = getattr(model, "vision_model", model)  # CLIP/SigLIP: take the vision tower
        hidden = getattr(self.model.config, "hidden_size", None)
        if hidden is None:
            raise ValueError(f"vision encoder {path}: its config has no hidden_size")
        mean, std = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]
        pre = folder / "preprocessor_config.json"
        if pre.exists():
            cfg = json.loads(pre.read_text())
            mean, std = cfg.get("image_mean", mean), cfg.get("image_std", std)
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        self.tokens = tokens_per_image
        self.proj = nn.Linear(hidden, out_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = (images - self.mean.to(images.dtype)) / self.std.to(images.dtype)
        h = self.model(pixel_values=x).last_hidden_state  # (I, P', hidden), maybe with a CLS token
        grid = int(round(h.shape[1] ** 0.5))
        if grid * grid != h.shape[1]:
            h = h[:, 1:]  # drop CLS/register token(s) in front of a square grid
        if h.shape[1] != self.tokens:
            h = F.adaptive_avg_pool1d(h.transpose(1, 2), self.tokens).transpose(1, 2)
        return self.proj(h)
