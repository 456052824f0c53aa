"""The MFU FLOP count against PyTorch's FLOP counter; local Hugging Face encoder and tokenizer options."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.training.config import PRESETS, TrainConfig
from roboloop.training.model import VLAPolicy, train_flops
from roboloop.training.packing import Sample, collate
from roboloop.training.train import train


@pytest.mark.parametrize("preset,encoder", [("tiny", "patch"), ("small", "patch"), ("tiny", "keypoints")])
def test_train_flops_matches_flop_counter(preset, encoder):
    cfg = PRESETS[preset](state_dim=6, action_dim=7, image_size=(64, 64), image_encoder=encoder)
    model = VLAPolicy(cfg)
    g = torch.Generator().manual_seed(0)
    samples = [Sample([torch.rand(3, 64, 64, generator=g) for _ in range(cams)], torch.randint(0, 256, (n,)),
                      torch.randn(6), torch.randn(cfg.horizon, 7), torch.ones(cfg.horizon, dtype=torch.bool))
               for cams, n in ((2, 20),)]
    b = collate(samples, cfg.tokens_per_image)
    with FlopCounterMode(display=False) as fc:
        model.loss(b).backward()
    estimate = train_flops(cfg, b.seq_lens.tolist(), int(b.images.shape[0]))
    assert 0.9 <= estimate / fc.get_total_flops() <= 1.15


@pytest.fixture(scope="module")
def hf_assets(tmp_path_factory):
    """A tiny ViT and a WordPiece tokenizer, written locally (no Hub)."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    root = tmp_path_factory.mktemp("hf")
    vit = transformers.ViTModel(transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32,
                                                       num_hidden_layers=1, num_attention_heads=2,
                                                       intermediate_size=64), add_pooling_layer=False)
    vit.save_pretrained(root / "vit")
    words = ["pick", "up", "the", "red", "cube", "place", "it", "in", "box", "push", "green", "block",
             "reach", "blue", "ball", "[UNK]", "[CLS]", "[SEP]", "[PAD]"]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    fast.save_pretrained(root / "tok")
    return root / "vit", root / "tok", len(words)


def test_local_hf_vision_encoder_and_tokenizer_train(hf_assets, tmp_path):
    vit_dir, tok_dir, vocab = hf_assets
    src = generate_v21(tmp_path / "v21", GenSpec(num_episodes=2, min_length=12, max_length=16,
                                                 cameras={"observation.images.top": (32, 32)}, seed=2))
    v3 = convert(src, tmp_path / "v3", ConvertConfig(progress=False))
    cfg = TrainConfig(dataset=str(v3), output_dir=str(tmp_path / "out"), steps=4, checkpoint_every_steps=0,
                      max_tokens=512, model_overrides={"image_size": [32, 32], "patch_size": 8, "horizon": 4,
                                                       "vision_encoder": str(vit_dir), "tokenizer": str(tok_dir)})
    result = train(cfg)
    assert torch.isfinite(torch.tensor(result.final_loss))
    saved = json.loads((tmp_path / "out" / "config.json").read_text())["model"]
    assert saved["vocab_size"] == vocab and saved["vision_encoder"] == str(vit_dir)
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "out" / "model.safetensors")
    assert any(k.startswith("vision.model.") for k in weights) and "patch.weight" not in weights


def test_hf_paths_must_be_local_folders(tmp_path):
    pytest.importorskip("transformers")
    from roboloop.training.hf import load_tokenizer

    with pytest.raises(FileNotFoundError, match="never reaches the Hub"):
        load_tokenizer("google/siglip-base-patch16-224")
