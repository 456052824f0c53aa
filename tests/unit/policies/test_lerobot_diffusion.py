"""LeRobot's Diffusion Policy on roboloop's engine: a policy that reads two observation frames.

roboloop's loader must give what `LeRobotDataset` gives with Diffusion's delta_timestamps (the state and every
camera at t-1 and t, the first frame repeated at an episode's start, the action chunk from t-1 with its padding),
LeRobot must read the trained folder and act from it, and roboloop's offline scoring and Evaluator must hand the
policy its previous frame.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from roboloop.training.config import TrainConfig
from roboloop.training.train import train
from tests.conformance.cases import LEROBOT_QUIET, lerobot_writer
from tests.unit.policies.pairs import lerobot_batch, roboloop_batch

pytestmark = LEROBOT_QUIET

CAMS = {"observation.images.front": (32, 32)}
IMAGES = {"observation.image": (32, 32)}
DIFFUSION = {"down_dims": [16, 32], "horizon": 8, "n_action_steps": 4, "diffusion_step_embed_dim": 16,
             "spatial_softmax_num_keypoints": 8, "num_inference_steps": 2, "n_groups": 4}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("diffusion") / "ds"
    lerobot_writer(CAMS, IMAGES, ["push the block"], num_episodes=3)(root)
    return root


def _cfg(ds, out, **kw) -> TrainConfig:
    return TrainConfig(**{"dataset": str(ds), "output_dir": str(out), "policy_type": "diffusion",
                          "policy_config": DIFFUSION, "steps": 3, "max_samples": 4, "warmup_steps": 1,
                          "checkpoint_every_steps": 0, "num_workers": 1, **kw})


def test_history_batches_are_lerobots(recorded):
    from roboloop.policies import family
    from roboloop.training.data import V3Dataset
    from roboloop.training.train import features_of

    ds = V3Dataset(recorded, horizon=8)
    trainable = family("lerobot").build(_cfg(recorded, "unused"), features_of(ds, True))
    assert trainable.needs.history == 2 and trainable.needs.horizon == 8
    keys = [0, 1, 9, 20]  # an episode's first frame (history clamped), its second, one near an end (padded)
    ours = roboloop_batch(ds, trainable, keys, cameras=trainable.cameras, history=2)
    obs = [-1 / 30, 0.0]
    theirs = lerobot_batch(recorded, keys, {"observation.state": obs, **{k: obs for k in trainable.cameras},
                                            "action": [(i - 1) / 30 for i in range(8)]},
                           ("observation.state", "action", "action_is_pad", *trainable.cameras))
    assert ours["observation.state"].shape == (4, 2, 6)
    assert torch.equal(ours["observation.state"], theirs["observation.state"])
    assert torch.equal(ours["action_is_pad"], theirs["action_is_pad"]) and bool(theirs["action_is_pad"].any())
    assert torch.equal(ours["action"], theirs["action"])  # padded steps too: Diffusion does not mask them
    for cam in trainable.cameras:
        assert ours[cam].shape == theirs[cam].shape == (4, 2, 3, 32, 32), cam
        assert float((ours[cam] - theirs[cam]).abs().max()) <= 2 / 255 + 1e-6, cam


def test_samples_are_the_frames_lerobots_sampler_draws(recorded):
    """Diffusion's `drop_n_last_frames`: the frames an epoch draws are the ones LeRobot's EpisodeAwareSampler
    draws (each episode's last frames, whose chunk would be mostly padding, never a sample)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.datasets.sampler import EpisodeAwareSampler

    from roboloop.policies import family
    from roboloop.training.data import SampleStream, V3Dataset
    from roboloop.training.train import features_of

    ds = V3Dataset(recorded, horizon=8)
    lr = LeRobotDataset("conformance/writer", root=recorded)
    for override, episodes in (({}, None), ({"drop_n_last_frames": 2}, [0, 2])):
        cfg = _cfg(recorded, "unused", policy_config={**DIFFUSION, **override})
        needs = family("lerobot").build(cfg, features_of(ds, True)).needs
        assert needs.drop_last == override.get("drop_n_last_frames", 7)
        theirs = EpisodeAwareSampler(lr.meta.episodes["dataset_from_index"], lr.meta.episodes["dataset_to_index"],
                                     episode_indices_to_use=episodes, drop_n_last_frames=needs.drop_last).indices
        stream = SampleStream(ds, None, 1, shuffle_buffer=1, with_video=False, episodes=episodes,
                              drop_last=needs.drop_last)
        ours = [stream.next_key() for _ in theirs]
        assert sorted(ours) == sorted(theirs) and len(set(ours)) == len(ours) < len(lr)
        assert stream.epoch == 0
        stream.next_key()  # one more starts the next epoch
        assert stream.epoch == 1
        stream.close()
    with pytest.raises(ValueError, match="no episode is longer than the 500 last frames"):
        SampleStream(ds, None, 1, with_video=False, drop_last=500)


def test_diffusion_trains_lerobot_reads_it_and_roboloop_scores_it_with_its_past(recorded, tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.policies.factory import make_pre_post_processors

    from roboloop.offline import evaluate_offline
    from roboloop.policies import load_policy
    from roboloop.policies.obs import Obs

    out = tmp_path / "diffusion"
    train(_cfg(recorded, out, val_fraction=0.34))
    assert all(np.isfinite(json.loads(line)["loss"]) for line in (out / "metrics.jsonl").read_text().splitlines())
    policy = DiffusionPolicy.from_pretrained(str(out))
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(out))
    item = LeRobotDataset("conformance/writer", root=recorded)[5]
    batch = {k: v for k, v in item.items() if k.startswith("observation.") and not k.endswith("_is_pad")}
    action = post(policy.select_action(pre({**batch, "task": item["task"]})))
    assert action.shape == (1, 6) and torch.isfinite(action).all()
    ours = load_policy(out)
    assert ours.history == 2 and ours.horizon == 4

    def frame(i: int) -> Obs:
        it = LeRobotDataset("conformance/writer", root=recorded)[i]
        return Obs(it["observation.state"][None], {k: (it[k].permute(1, 2, 0)[None] * 255).to(torch.uint8)
                                                     for k in (*CAMS, *IMAGES)}, [it["task"]])

    now = frame(5)
    now.past = [frame(4)]
    assert ours.act(now).shape == (1, 4, 6)
    report = evaluate_offline(recorded, out, "validation", output_dir=tmp_path / "offline")
    assert np.isfinite(report.mse_norm) and report.samples > 0


def test_cameras_of_different_sizes_are_refused_with_lerobots_reason(tmp_path):
    from roboloop.policies.lerobot import LeRobotPolicyError

    root = tmp_path / "mixed"
    lerobot_writer({"observation.images.front": (32, 48)}, {"observation.image": (24, 24)}, ["x"], num_episodes=1)(root)
    with pytest.raises(LeRobotPolicyError, match="diffusion cannot train on this dataset: .*all image shapes"):
        train(_cfg(root, tmp_path / "out"))
