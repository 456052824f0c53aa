"""Which of LeRobot's policy types roboloop trains, and why the others are refused (no torch, no LeRobot import:
the configs validate with it)."""

from __future__ import annotations

# types LeRobot's factory has that train here, and why the others are refused
SUPPORTED = ("act", "diffusion", "vqbet", "smolvla")
REFUSED = {
    "tdmpc": "is trained online with rewards (a model-based RL agent), not from demonstrations",
    "pi0": "is not trained on roboloop's engine yet (PaliGemma's tokenizer and weights from a local folder); "
           "`roboloop plan --policy-type pi0` sizes its fine-tune",
    "pi05": "is not trained on roboloop's engine yet (PaliGemma's tokenizer and weights from a local folder); "
            "`roboloop plan --policy-type pi05` sizes its fine-tune",
    "pi0_fast": "needs PaliGemma weights from the Hugging Face Hub: not supported yet",
    "groot": "builds its Qwen3-VL backbone by loading the GR00T N1.7 base model's weights (transformers "
             "from_pretrained of nvidia/GR00T-N1.7-3B) from the Hugging Face Hub: not supported yet",
    "gaussian_actor": "is the actor of LeRobot's online RL (SAC, HIL-SERL), trained with rewards, not from "
                      "demonstrations",
    "multi_task_dit": "needs the CLIP vision and text encoders (openai/clip-vit-base-patch16) from the Hugging Face "
                      "Hub: not supported yet",
    "xvla": "needs the BART tokenizer (facebook/bart-large) from the Hugging Face Hub: not supported yet",
    "eo1": "needs the Qwen2.5-VL-3B weights from the Hugging Face Hub: not supported yet",
    "evo1": "needs the InternVL3-1B weights from the Hugging Face Hub: not supported yet",
    "wall_x": "needs the WALL-OSS (Qwen2.5-VL) weights from the Hugging Face Hub: not supported yet",
    "vla_jepa": "needs the Qwen3-VL-2B and V-JEPA 2 weights from the Hugging Face Hub: not supported yet",
    "molmoact2": "needs the MolmoAct2 weights from the Hugging Face Hub: not supported yet",
    "fastwam": "needs the Wan2.2 video model weights from the Hugging Face Hub: not supported yet",
    "lingbot_va": "needs the Wan2.2-based LingBot-VA weights from the Hugging Face Hub: not supported yet",
}


def check(policy_type: str) -> str:
    """`policy_type` if roboloop trains it; otherwise a ValueError with the reason."""
    if policy_type in REFUSED:
        raise ValueError(f"policy_type {policy_type!r} {REFUSED[policy_type]}")
    if policy_type not in SUPPORTED:
        raise ValueError(f"policy_type {policy_type!r} is not one of LeRobot's policies roboloop trains: use one of "
                         f"{', '.join(SUPPORTED)}")
    return policy_type
