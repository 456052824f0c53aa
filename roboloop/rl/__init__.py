"""RL fine-tuning of the VLA in Isaac Lab: flow-noise PPO (`objective`, `policy`), Ray workers (`workers`), runs."""
