"""LeRobot's VQ-BeT on roboloop's engine: a policy that reads several past frames, predicts actions from its oldest
frame on, and trains in two phases inside one run (its residual VQ-VAE on action chunks first, then its GPT).

roboloop's loader must give what `LeRobotDataset` gives with VQ-BeT's delta_timestamps, the same weights on the
same batch must give the same loss in both phases, the switch must happen where LeRobot's code puts it, LeRobot
must read the trained folder and act from it, and a run stopped in either phase must resume exactly.
"""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import torch

from roboloop.training.config import TrainConfig
from roboloop.training.train import train
from tests.conformance.cases import LEROBOT_QUIET, lerobot_writer
from tests.unit.policies.pairs import assert_same_loss, lerobot_batch, roboloop_batch, seeded_loss

pytestmark = LEROBOT_QUIET

CAMS = {"observation.images.front": (32, 32)}  # VQ-BeT reads exactly one camera
SMALL_VQBET = {"n_obs_steps": 3, "n_action_pred_token": 2, "action_chunk_size": 3, "crop_shape": [24, 24],
               "spatial_softmax_num_keypoints": 8, "n_vqvae_training_steps": 5, "vqvae_n_embed": 8,
               "vqvae_embedding_dim": 16, "vqvae_enc_hidden_dim": 16, "gpt_block_size": 64, "gpt_input_dim": 32,
               "gpt_output_dim": 32, "gpt_n_layer": 1, "gpt_n_head": 2, "gpt_hidden_dim": 32}
WINDOW = list(range(-2, 4))  # LeRobot's action_delta_indices: range(1 - n_obs_steps, n_action_pred_token + chunk - 1)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("vqbet") / "ds"
    lerobot_writer(CAMS, {}, ["push the block"], num_episodes=3)(root)
    return root


def _cfg(ds, out, **kw) -> TrainConfig:
    return TrainConfig(**{"dataset": str(ds), "output_dir": str(out), "policy_type": "vqbet",
                          "policy_config": SMALL_VQBET, "steps": 8, "max_samples": 4, "warmup_steps": 1,
                          "checkpoint_every_steps": 0, "num_workers": 1, **kw})


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_vqbet_batches_are_lerobots_and_give_the_same_loss_in_both_phases(recorded):
    from roboloop.policies import family
    from roboloop.training.data import V3Dataset
    from roboloop.training.train import features_of

    ds = V3Dataset(recorded, horizon=len(WINDOW))
    torch.manual_seed(0)
    trainable = family("lerobot").build(_cfg(recorded, "unused"), features_of(ds, True))
    assert trainable.needs.history == 3 and trainable.needs.horizon == len(WINDOW)
    assert trainable.needs.drop_last == 0  # as under lerobot-train: VQ-BeT's config has no drop_n_last_frames
    keys = [0, 1, 9, 21]  # an episode's first frames (history clamped, actions before it padded), one near an end
    ours = roboloop_batch(ds, trainable, keys, cameras=trainable.cameras, history=3)
    obs = [-2 / 30, -1 / 30, 0.0]
    theirs = lerobot_batch(recorded, keys, {"observation.state": obs, **{k: obs for k in CAMS},
                                            "action": [i / 30 for i in WINDOW]},
                           ("observation.state", "action", "action_is_pad", *CAMS))
    assert ours["observation.state"].shape == (4, 3, 6) and ours["action"].shape == (4, 6, 6)
    assert torch.equal(ours["observation.state"], theirs["observation.state"])
    assert torch.equal(ours["action_is_pad"], theirs["action_is_pad"])
    assert bool(theirs["action_is_pad"][0, 0]) and bool(theirs["action_is_pad"][3, -1])  # before a start, past an end
    assert torch.equal(ours["action"], theirs["action"])  # padded steps too: VQ-BeT does not mask them
    for cam in CAMS:
        assert ours[cam].shape == theirs[cam].shape == (4, 3, 3, 32, 32), cam
        assert float((ours[cam] - theirs[cam]).abs().max()) <= 2 / 255 + 1e-6, cam
    for phase in ("vqvae", "gpt"):  # each phase's loss, from copies: a step moves the VQ-VAE and its step count
        policy = copy.deepcopy(trainable.module.policy).eval()
        if phase == "gpt":
            policy.vqbet.action_head.vqvae_model.discretized.fill_(True)
        other = copy.deepcopy(policy)
        a, info = seeded_loss(policy, trainable.preprocessor, ours)
        assert ("recon_l1_error" in info) == (phase == "vqvae")
        assert_same_loss(a, seeded_loss(other, trainable.preprocessor, theirs)[0], phase)


def test_vqbet_trains_both_phases_lerobot_reads_it_and_roboloop_acts_with_its_past(recorded, tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.vqbet.modeling_vqbet import VQBeTPolicy

    from roboloop.offline import evaluate_offline
    from roboloop.policies import load_policy
    from roboloop.policies.obs import Obs

    out = tmp_path / "vqbet"
    train(_cfg(recorded, out, val_fraction=0.34))
    rows = _rows(out)
    # the first n_vqvae_training_steps steps train the VQ-VAE, the rest the GPT; LeRobot's numbers for each
    assert [r["vqbet_phase"] for r in rows] == ["vqvae"] * 5 + ["gpt"] * 3
    assert "vqbet_recon_l1_error" in rows[0] and "vqbet_offset_loss" in rows[-1]
    assert all(np.isfinite(r["loss"]) for r in rows)
    policy = VQBeTPolicy.from_pretrained(str(out))  # LeRobot's own loaders: the VQ-VAE arrives trained
    assert bool(policy.vqbet.action_head.vqvae_model.discretized)
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(out))
    item = LeRobotDataset("conformance/writer", root=recorded)[5]
    batch = {k: v for k, v in item.items() if k.startswith("observation.") and not k.endswith("_is_pad")}
    action = post(policy.select_action(pre({**batch, "task": item["task"]})))
    assert action.shape == (1, 6) and torch.isfinite(action).all()
    ours = load_policy(out)
    assert ours.history == 3 and ours.horizon == 3

    def frame(i: int) -> Obs:
        it = LeRobotDataset("conformance/writer", root=recorded)[i]
        return Obs(it["observation.state"][None], {k: (it[k].permute(1, 2, 0)[None] * 255).to(torch.uint8)
                                                     for k in CAMS}, [it["task"]])

    now = frame(5)
    now.past = [frame(3), frame(4)]
    chunk = ours.act(now)
    assert chunk.shape == (1, 3, 6) and torch.isfinite(chunk).all()
    report = evaluate_offline(recorded, out, "validation", output_dir=tmp_path / "offline")
    assert np.isfinite(report.mse_norm) and report.samples > 0


def test_vqbet_resumes_exactly_in_either_phase(recorded, tmp_path):
    """Stopped mid-VQ-VAE (step 4 of 5: LeRobot keeps that count in no state dict) and after the switch (step 8),
    the resumed run's losses are the uninterrupted run's, bit for bit."""
    kw = dict(steps=10, checkpoint_every_steps=2, keep_last=10, deterministic=True, lr_schedule="constant")
    ref = tmp_path / "ref"
    train(_cfg(recorded, ref, **kw))
    want = [r["loss"] for r in _rows(ref)]
    assert [r["vqbet_phase"] for r in _rows(ref)] == ["vqvae"] * 5 + ["gpt"] * 5
    for stopped in (4, 8):  # the run as a stop there leaves it: that checkpoint, and rows written after it
        run = tmp_path / f"stopped-{stopped}"
        (run / "checkpoints").mkdir(parents=True)
        shutil.copytree(ref / "checkpoints" / f"step-{stopped:08d}", run / "checkpoints" / f"step-{stopped:08d}")
        for name in ("run_config.json", "metrics.jsonl"):
            shutil.copy(ref / name, run / name)
        result = train(_cfg(recorded, run, **kw))
        assert result.resumed_from == stopped
        assert [r["loss"] for r in _rows(run)] == want, stopped
    # what the checkpoint taken after the switch gives a fresh model: the count, and the VQ-VAE frozen as LeRobot's
    # switch left it (eval mode, its codebooks neither learnt nor updated)
    from safetensors.torch import load_file

    from roboloop.policies import family
    from roboloop.training import checkpoint
    from roboloop.training.data import V3Dataset
    from roboloop.training.train import features_of

    for load in (lambda m: m.load_state_dict(checkpoint.load(ref / "checkpoints" / "step-00000008")["model"]),
                 lambda m: m.policy.load_state_dict(load_file(ref / "model.safetensors"))):  # init_from's load
        module = family("lerobot").build(_cfg(recorded, "unused"), features_of(V3Dataset(recorded), True)).module
        vq = module.policy.vqbet.action_head.vqvae_model
        assert vq.training and not bool(vq.discretized)
        load(module)
        assert bool(vq.discretized) and bool(vq.vq_layer.freeze_codebook)
        assert not vq.training and not any(p.requires_grad for p in vq.vq_layer.parameters())
    assert module.get_extra_state() == {"vqvae_optimized_steps": 0}  # the final weights carry no count
    module.load_state_dict(checkpoint.load(ref / "checkpoints" / "step-00000008")["model"])
    assert module.get_extra_state() == {"vqvae_optimized_steps": 5}


def test_vqbet_on_several_ranks_is_refused_with_the_reason(recorded, tmp_path):
    from roboloop.training.distributed import DistEnv
    from roboloop.training.train import Trainer

    with pytest.raises(ValueError, match="2 ranks: vqbet switches from training its VQ-VAE"):
        Trainer(_cfg(recorded, tmp_path / "x"), DistEnv(0, 2, 0, torch.device("cpu")))
