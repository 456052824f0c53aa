"""LeRobot's own environments as evaluation tasks (`lerobot:<env type>`): the environment comes from LeRobot's env
config, its observation keys are named by the config's `features_map`, and LeRobot policies trained on data with
those features run in it through roboloop's Evaluator (Diffusion with its previous frame)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from roboloop.errors import UnknownTaskError
from roboloop.sim import make_env

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]


def test_pusht_from_lerobots_env_config_maps_its_keys():
    env = make_env("lerobot:pusht", 2, seed=0)
    try:
        obs = env.reset()
        assert set(obs.images) == {"observation.image"}  # pixels -> observation.image
        assert obs.images["observation.image"].shape == (2, 96, 96, 3)
        assert obs.state.shape == (2, 2) and env.action_dim == 2 and env.fps == 10  # agent_pos -> state
    finally:
        env.close()
    with pytest.raises(UnknownTaskError, match="LeRobot's env configs have .*pusht"):
        make_env("lerobot:no_such_env", 1)


POLICIES = {"act": {"dim_model": 32, "dim_feedforward": 64, "n_encoder_layers": 1, "n_decoder_layers": 1,
                    "n_heads": 2, "chunk_size": 8, "n_action_steps": 8},
            "diffusion": {"down_dims": [16, 32], "horizon": 8, "n_action_steps": 4, "diffusion_step_embed_dim": 16,
                          "spatial_softmax_num_keypoints": 8, "num_inference_steps": 2, "n_groups": 4}}


def test_a_diffusion_policy_trained_here_runs_in_lerobots_pusht(tmp_path):
    """Diffusion (with its previous frame) trained on roboloop's engine; ACT runs there in the test below, from
    `lerobot-train`, and roboloop-trained ACT in the closed loop (tests/isaac/test_act_loop.py)."""
    policy_type = "diffusion"

    def cli(*args) -> dict:
        p = subprocess.run([sys.executable, "-m", "roboloop.cli", *map(str, args)], capture_output=True, text=True,
                           cwd=tmp_path, timeout=900)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    cli("generate", tmp_path / "pusht_like", "--v3", "--num-episodes", "2", "--min-length", "20", "--max-length",
        "20", "--state-dim", "2", "--action-dim", "2", "--camera", "observation.image=48x48")
    cli("train", "--dataset", tmp_path / "pusht_like", "--output-dir", tmp_path / "model", "--policy-type",
        policy_type, "--policy-config", json.dumps(POLICIES[policy_type]), "--steps", "2", "--max-samples", "4",
        "--checkpoint-every-steps", "0")
    report = cli("evaluate", "--task", "lerobot:pusht", "--policy", tmp_path / "model", "--episodes", "1",
                 "--num-envs", "1", "--videos", "0", "--output-dir", tmp_path / "eval")
    assert report["episodes"] == 1 and report["task"] == "lerobot:pusht" and report["backend"] == "gymnasium"


def test_a_lerobot_train_checkpoint_runs_in_a_task_with_its_features_and_is_gated(tmp_path):
    import os
    from pathlib import Path

    def cli(*args, ok=(0,)) -> dict:
        p = subprocess.run([sys.executable, "-m", "roboloop.cli", *map(str, args)], capture_output=True, text=True,
                           cwd=tmp_path, timeout=900)
        assert p.returncode in ok, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    cli("generate", tmp_path / "pusht_like", "--v3", "--num-episodes", "2", "--min-length", "20", "--max-length",
        "20", "--state-dim", "2", "--action-dim", "2", "--camera", "observation.image=48x48")
    venv = Path(sys.executable).parent
    p = subprocess.run([str(venv / "lerobot-train"), "--dataset.repo_id=local/pusht_like",
                        f"--dataset.root={tmp_path / 'pusht_like'}", "--policy.type=act",
                        "--policy.pretrained_backbone_weights=null", "--policy.device=cpu",
                        "--policy.push_to_hub=false",
                        *[f"--policy.{k}={v}" for k, v in POLICIES["act"].items()], "--steps=2", "--batch_size=2",
                        "--save_freq=2", f"--output_dir={tmp_path / 'lr'}", "--num_workers=0", "--wandb.enable=false"],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = tmp_path / "lr" / "checkpoints" / "000002" / "pretrained_model"
    report = cli("evaluate", "--task", "lerobot:pusht", "--policy", ckpt, "--episodes", "1", "--num-envs", "1",
                 "--videos", "0", "--output-dir", tmp_path / "eval")
    assert report["episodes"] == 1
    added = cli("registry", "--registry", tmp_path / "reg", "add", "pusht-act", ckpt, "--eval", tmp_path / "eval",
                "--promote", ok=(0, 3))
    assert added["version"] == 1 and added["promoted"] is False and added["reason"]  # the gate says why
