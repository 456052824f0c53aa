"""Which of LeRobot's policy types roboloop trains, and why the others are refused (no torch, no LeRobot import:
the configs validate with it)."""

from __future__ import annotations

# types LeRobot's factory has that train here, and why the others are refused
SUPPORTED = ("act", "diffusion")
REFUSED = {
    "vqbet": "trains in two phases (a VQ-VAE first, then the policy) that roboloop's trainer does not run yet",
    "tdmpc": "is trained online with rewards (a model-based RL agent), not from demonstrations",
    "smolvla": "needs the SmolVLM2 weights from the Hugging Face Hub: not supported yet (no local-folder path)",
    "pi0": "needs PaliGemma weights from the Hugging Face Hub: not supported yet",
    "pi05": "needs PaliGemma weights from the Hugging Face Hub: not supported yet",
    "pi0_fast": "needs PaliGemma weights from the Hugging Face Hub: not supported yet",
    "groot": "needs the GR00T N1.5 weights from the Hugging Face Hub: use roboloop's own VLA (family vla)",
}


def check(policy_type: str) -> str:
    """`policy_type` if roboloop trains it; otherwise a ValueError with the reason."""
    if policy_type in REFUSED:
        raise ValueError(f"policy_type {policy_type!r} {REFUSED[policy_type]}")
    if policy_type not in SUPPORTED:
        raise ValueError(f"policy_type {policy_type!r} is not one of LeRobot's policies roboloop trains: use one of "
                         f"{', '.join(SUPPORTED)}")
    return policy_type
