"""A SmolVLM2-shaped backbone folder made offline (no Hub): the config, processor and tokenizer files a real
`HuggingFaceTB/SmolVLM2-500M-Video-Instruct` download has, at a size that trains on a CPU in seconds.

The tokenizer is byte-level (every byte a token, by byte fallback) with SmolVLM's special tokens, so SmolVLA's
processor and its `fake_image_token_id` / `global_image_token_id` work as with the real one."""

from __future__ import annotations

from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<fake_token_around_image>", "<image>", "<global-img>",
           "<end_of_utterance>"]


def tiny_smolvlm(dst: Path, weights: bool = False) -> Path:
    """Writes the folder; `weights`: a random model.safetensors too (what `load_vlm_weights` reads)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import (
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
    )
    from transformers.models.smolvlm.video_processing_smolvlm import SmolVLMVideoProcessor

    vocab = {t: i for i, t in enumerate(SPECIAL)}
    vocab.update({f"<0x{b:02X}>": len(SPECIAL) + b for b in range(256)})
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token=None))
    core.decoder = decoders.ByteFallback()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|im_start|>", eos_token="<end_of_utterance>",
                                  pad_token="<|endoftext|>", unk_token="<|endoftext|>",
                                  extra_special_tokens={"fake_image_token": "<fake_token_around_image>",
                                                        "image_token": "<image>",
                                                        "global_image_token": "<global-img>",
                                                        "end_of_utterance_token": "<end_of_utterance>"})
    tok.add_special_tokens({"additional_special_tokens": SPECIAL[3:]})
    cfg = SmolVLMConfig(
        text_config={"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": len(tok),
                     "max_position_embeddings": 512, "pad_token_id": 0},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 64, "patch_size": 16},
        scale_factor=2, image_token_id=tok.convert_tokens_to_ids("<image>"), vocab_size=len(tok), pad_token_id=0)
    dst.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(dst)
    SmolVLMProcessor(image_processor=SmolVLMImageProcessor(size={"longest_edge": 64},
                                                           max_image_size={"longest_edge": 64}),
                     tokenizer=tok, video_processor=SmolVLMVideoProcessor(), image_seq_len=4).save_pretrained(dst)
    if weights:
        SmolVLMForConditionalGeneration(cfg).save_pretrained(dst)
    return dst


# SmolVLA at the tiny backbone's size: its 4 layers, images padded to the vision model's 64x64, short chunks
SMALL_SMOLVLA = {"resize_imgs_with_padding": [64, 64], "num_vlm_layers": 4, "chunk_size": 5, "n_action_steps": 5,
                 "max_state_dim": 8, "max_action_dim": 8, "tokenizer_max_length": 48, "num_steps": 2}
