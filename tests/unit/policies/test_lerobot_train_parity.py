"""roboloop against `lerobot-train` itself, on the same LeRobot-written dataset and ACT config.

Curves: both train 50 steps at batch 4 with ACT's optimiser settings (AdamW, lr 1e-5, weight decay 1e-4, grad
clip 10); their data orders and noise draws differ, so the per-step losses are compared as samples: the means of
steps 31-50 must be shown equivalent within a margin of 15% of lerobot-train's (two one-sided Welch tests, TOST,
p < 0.05: failing to find a difference in 20 noisy losses proved little), and both must have fallen from their
start. (Same weights + the same batch give the same loss: test_lerobot_family.py.) Then the checkpoint
lerobot-train wrote is brought in with `roboloop registry add`, scored offline from the registry and gated.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance.cases import lerobot_writer

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]
ACT = {"dim_model": 32, "dim_feedforward": 64, "n_encoder_layers": 1, "n_decoder_layers": 1, "n_heads": 2,
       "latent_dim": 8, "chunk_size": 5, "n_action_steps": 5}
STEPS = 50


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    lerobot_writer({"observation.images.front": (32, 48)}, {"observation.image": (24, 24)}, ["pick the cube"],
                   num_episodes=4)(root / "ds")
    venv = Path(sys.executable).parent
    cmd = [str(venv / "lerobot-train"), "--dataset.repo_id=conformance/writer", f"--dataset.root={root / 'ds'}",
           "--policy.type=act", "--policy.pretrained_backbone_weights=null", "--policy.device=cpu",
           "--policy.push_to_hub=false", *[f"--policy.{k}={v}" for k, v in ACT.items()], f"--steps={STEPS}",
           "--batch_size=4", f"--save_freq={STEPS}", "--log_freq=1", f"--output_dir={root / 'lr'}",
           "--num_workers=0", "--wandb.enable=false", "--seed=0"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=root,
                       env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})
    assert p.returncode == 0, p.stderr[-3000:]
    theirs = [float(x) for x in re.findall(r"step:\S+ .*?loss:([0-9.e+-]+)", p.stdout + p.stderr)]
    from roboloop.training.config import TrainConfig
    from roboloop.training.train import train

    train(TrainConfig(dataset=str(root / "ds"), output_dir=str(root / "rl"), policy_type="act", policy_config=ACT,
                      steps=STEPS, max_samples=4, lr=1e-5, weight_decay=1e-4, grad_clip=10.0, warmup_steps=0,
                      checkpoint_every_steps=0, num_workers=1))
    ours = [json.loads(line)["loss"] for line in (root / "rl" / "metrics.jsonl").read_text().splitlines()]
    return root, ours, theirs


MARGIN = 0.15  # equivalence margin on the tail's mean loss, relative to lerobot-train's


def _tost_p(a: list[float], b: list[float], margin: float) -> float:
    """Two one-sided Welch tests: the p-value of 'mean(a) - mean(b) is outside +-margin' (small: equivalent)."""
    from scipy import stats

    above = stats.ttest_ind([x + margin for x in a], b, equal_var=False, alternative="greater").pvalue
    below = stats.ttest_ind([x - margin for x in a], b, equal_var=False, alternative="less").pvalue
    return float(max(above, below))


def test_loss_curves_agree_with_lerobot_train(runs):
    _, ours, theirs = runs
    assert len(ours) == STEPS and len(theirs) >= STEPS, (len(ours), len(theirs))
    theirs = theirs[-STEPS:]
    tail_ours, tail_theirs = ours[30:], theirs[30:]
    mean = lambda x: sum(x) / len(x)  # noqa: E731
    p = _tost_p(tail_ours, tail_theirs, MARGIN * mean(tail_theirs))
    assert p < 0.05, (mean(tail_ours), mean(tail_theirs), p)
    assert mean(ours[-10:]) < mean(ours[:5]) and mean(theirs[-10:]) < mean(theirs[:5])
    assert all(math.isfinite(x) for x in ours)


def test_a_lerobot_train_checkpoint_registers_scores_offline_and_is_gated(runs, tmp_path):
    root, _, _ = runs
    ckpt = root / "lr" / "checkpoints" / f"{STEPS:06d}" / "pretrained_model"
    reg = tmp_path / "registry"

    def cli(*args: str) -> dict:
        p = subprocess.run([sys.executable, "-m", "roboloop.cli", *args], capture_output=True, text=True,
                           cwd=tmp_path, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert p.returncode in (0, 3), p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    added = cli("registry", "--registry", str(reg), "add", "act-lr", str(ckpt), "--dataset", str(root / "ds"),
                "--score-offline", "all", "--promote")
    from tests.gates import expected_decision

    assert added["version"] == 1 and (added["promoted"], added["reason"]) == expected_decision(reg, "act-lr", 1)
    from roboloop.registry import Registry

    lineage = Registry(reg).lineage("act-lr", 1)
    assert lineage["family"] == "lerobot" and lineage["dataset"]["num_episodes"] == 4
    assert lineage["config"]["train"]["trained_by"] == "lerobot-train"
    assert any("no held-out split" in n for n in lineage["config"]["unknown"])
    scored = cli("evaluate", "--offline", "--dataset", str(root / "ds"), "--policy", f"registry:{reg}#act-lr@1",
                 "--score", "all", "--output-dir", str(tmp_path / "off"))
    assert scored["samples"] > 0 and math.isfinite(scored["mse_norm"]) and set(scored["baselines"]) == \
        {"mean_action", "previous_action"}
    assert Registry(reg).lineage("act-lr", 1)["offline_eval"]["episodes"] == [0, 1, 2, 3]  # what the gate read


def test_training_continues_from_a_lerobot_train_checkpoint(runs, tmp_path):
    from roboloop.policies import model_info
    from roboloop.training.config import TrainConfig
    from roboloop.training.train import train

    root, _, _ = runs
    ckpt = root / "lr" / "checkpoints" / f"{STEPS:06d}" / "pretrained_model"
    result = train(TrainConfig(dataset=str(root / "ds"), output_dir=str(tmp_path / "ft"), policy_type="act",
                               policy_config=ACT, steps=3, max_samples=4, lr=1e-5, warmup_steps=0,
                               checkpoint_every_steps=0, num_workers=1, init_from=str(ckpt)))
    assert math.isfinite(result.final_loss) and model_info(tmp_path / "ft").train["init_from"] == str(ckpt)
    saved = json.loads((tmp_path / "ft" / "stats.json").read_text())
    assert set(saved) == {"observation.state", "action"}  # lerobot-train's normaliser, kept


def _example(name: str, *args: str, cwd: Path) -> dict:
    p = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[3] / "examples" / name), *args],
                       capture_output=True, text=True, cwd=cwd, timeout=600,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_examples_train_act_on_a_lerobot_dataset_and_gate_a_lerobot_train_checkpoint(runs, tmp_path):
    """examples/train_act.py on the LeRobot-written dataset (ACT small, 20 steps), then
    examples/register_checkpoint.py with lerobot-train's checkpoint: first version, gated against the better
    trivial predictor; then the roboloop-trained model, gated against that champion, or not shown better."""
    from roboloop.policies import model_info
    from roboloop.registry import Registry
    from tests.gates import expected_decision

    root, _, _ = runs
    trained = _example("train_act.py", str(root / "ds"), "--steps", "20", "--batch", "4", "--act", json.dumps(ACT),
                       "--out", str(tmp_path / "runs" / "act"), cwd=tmp_path)
    info = model_info(trained["model"])
    assert info.family == "lerobot" and info.train["steps"] == 20 and math.isfinite(trained["final_loss"])
    assert len(trained["held_out_episodes"]) == 1 and set(trained["baselines"]) == {"mean_action", "previous_action"}
    offline = json.loads((Path(trained["scores"]) / "offline.json").read_text())
    assert offline["mse_norm"] == trained["mse_norm"] and offline["episodes"] == trained["held_out_episodes"]

    reg = tmp_path / "registry"
    ckpt = root / "lr" / "checkpoints" / f"{STEPS:06d}" / "pretrained_model"
    for version, folder in ((1, ckpt), (2, Path(trained["model"]))):
        said = _example("register_checkpoint.py", str(folder), "--dataset", str(root / "ds"), "--name", "act",
                        "--registry", str(reg), cwd=tmp_path)
        assert said["version"] == version and (said["promoted"], said["reason"]) == \
            expected_decision(reg, "act", version), said
        assert said["champion"] == Registry(reg).aliases("act")[0].get("champion"), said
    assert said["trained_by"] == "roboloop" and Registry(reg).lineage("act", 1)["config"]["train"]["trained_by"] == \
        "lerobot-train"
