"""LeRobot's ACT on roboloop's engine, checked against LeRobot itself.

The dataset is written by LeRobot's own writer, with cameras at different resolutions, one stored as PNGs in the
parquet and a depth map (which ACT does not read: recorded as not used). roboloop's loader must give the batch
LeRobot's `LeRobotDataset` gives for the same frames (state, action chunk, padding, each camera at its own size),
the same weights on the same batch must give the same loss, LeRobot's `from_pretrained` must read the folder
roboloop writes, and a run killed with -9 must resume exactly.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from roboloop.training import checkpoint
from roboloop.training.config import TrainConfig
from roboloop.training.train import train
from tests.conformance.cases import LEROBOT_QUIET, lerobot_writer
from tests.unit.policies.pairs import assert_same_loss, lerobot_batch, roboloop_batch, seeded_loss
from tests.unit.training.conftest import kill9_at_step

pytestmark = LEROBOT_QUIET

CAMS = {"observation.images.front": (32, 48)}
IMAGES = {"observation.image": (24, 24)}
DEPTH = {"observation.images.depth": (24, 32)}
SMALL_ACT = {"dim_model": 32, "dim_feedforward": 64, "n_encoder_layers": 1, "n_decoder_layers": 1,
             "n_heads": 2, "latent_dim": 8, "chunk_size": 5, "n_action_steps": 5}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("act") / "ds"
    lerobot_writer(CAMS, IMAGES, ["pick the cube"], num_episodes=3, depth=DEPTH)(root)
    return root


def _cfg(ds, out, **kw) -> TrainConfig:
    return TrainConfig(**{"dataset": str(ds), "output_dir": str(out), "policy_type": "act",
                          "policy_config": SMALL_ACT, "steps": 4, "max_samples": 4, "warmup_steps": 1,
                          "checkpoint_every_steps": 0, "num_workers": 1, **kw})


def _losses(out) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_roboloop_batches_are_lerobots_and_give_the_same_loss(recorded):
    from roboloop.policies import family
    from roboloop.training.data import V3Dataset
    from roboloop.training.train import features_of

    ds = V3Dataset(recorded, horizon=5)
    torch.manual_seed(0)
    trainable = family("lerobot").build(_cfg(recorded, "unused"), features_of(ds, True))
    assert trainable.cameras == [*CAMS, *IMAGES]  # the depth map is not an ACT input
    keys = [0, 7, 11, 20]  # the last is 1 frame before an episode's end: its chunk is padded
    ours = roboloop_batch(ds, trainable, keys, cameras=trainable.cameras)
    theirs = lerobot_batch(recorded, keys, {"action": [i / 30 for i in range(5)]},
                           ("observation.state", "action", "action_is_pad", *trainable.cameras))
    assert torch.equal(ours["observation.state"], theirs["observation.state"])
    assert torch.equal(ours["action_is_pad"], theirs["action_is_pad"]) and bool(theirs["action_is_pad"].any())
    valid = ~theirs["action_is_pad"]
    assert torch.equal(ours["action"][valid], theirs["action"][valid])
    for cam in trainable.cameras:  # each at its own resolution; decoders agree within 2/255
        assert ours[cam].shape == theirs[cam].shape, cam
        assert float((ours[cam] - theirs[cam]).abs().max()) <= 2 / 255 + 1e-6, cam
    policy = trainable.module.policy.eval()  # no dropout: the same weights on the same batch
    theirs["action"][~valid] = 0.0  # what is under the padding does not count
    ours["action"][~valid] = 0.0
    assert_same_loss(seeded_loss(policy, trainable.preprocessor, ours)[0],
                     seeded_loss(policy, trainable.preprocessor, theirs)[0])


def test_act_trains_and_lerobot_reads_the_folder_and_acts_on_its_own_frame(recorded, tmp_path, capsys):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    from roboloop.policies import load_policy, model_info
    from roboloop.policies.obs import Obs

    out = tmp_path / "act"
    train(_cfg(recorded, out, val_fraction=0.34))
    info = model_info(out)
    assert info.family == "lerobot" and info.horizon == 5 and info.camera_keys == [*CAMS, *IMAGES]
    data = json.loads((out / "policy.json").read_text())
    assert data["train"]["policy_type"] == "act" and all(np.isfinite(_losses(out)))
    policy = ACTPolicy.from_pretrained(str(out))  # LeRobot's own loaders
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(out))
    item = LeRobotDataset("conformance/writer", root=recorded)[9]
    batch = {k: v for k, v in item.items() if k.startswith("observation.") and k != "observation.images.depth"}
    action = post(policy.select_action(pre({**batch, "task": item["task"]})))
    assert action.shape == (1, 6) and torch.isfinite(action).all()
    capsys.readouterr()
    ours = load_policy(out)  # and roboloop's, on a simulator-style observation (uint8 HWC frames)
    assert capsys.readouterr().out == ""  # LeRobot's "Loading weights..." print goes to stderr: stdout is a result
    obs = Obs(item["observation.state"][None], {k: (item[k].permute(1, 2, 0)[None] * 255).to(torch.uint8)
                                                  for k in (*CAMS, *IMAGES)}, [item["task"]])
    chunk = ours.act(obs)
    assert chunk.shape == (1, 5, 6) and torch.isfinite(chunk).all()
    with torch.no_grad():  # roboloop acts with ACT's norms folded into its convs: LeRobot's own chunk all the same
        same = ours.inputs(obs)
        theirs = post(policy.eval().predict_action_chunk(same))
    assert torch.allclose(ours.post(ours.chunk(same)), theirs, atol=1e-4), (chunk - theirs).abs().max()

    from roboloop.offline import evaluate_offline

    report = evaluate_offline(recorded, out, "validation", output_dir=tmp_path / "offline")
    assert report.episodes == info.split["validation_episodes"] and np.isfinite(report.mse_norm)


def test_act_resumes_exactly_after_kill_9(recorded, tmp_path):
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    kw = dict(steps=12, checkpoint_every_steps=4, deterministic=True)
    train(_cfg(recorded, ref, **kw))
    cfg = _cfg(recorded, killed, **kw)
    kill9_at_step(cfg, 6)
    assert not (killed / "model.safetensors").exists()
    assert checkpoint.latest(killed / "checkpoints").name == "step-00000004"
    assert train(cfg).resumed_from == 4
    assert _losses(killed) == _losses(ref)


def test_types_roboloop_does_not_train_are_refused_with_the_reason(recorded, tmp_path):
    from roboloop.policies.lerobot import LeRobotPolicyError, policy_config

    with pytest.raises(LeRobotPolicyError, match="online RL"):
        policy_config("gaussian_actor", {}, None, "cpu")
    with pytest.raises(LeRobotPolicyError, match="Hugging Face Hub"):
        policy_config("groot", {}, None, "cpu")
    with pytest.raises(LeRobotPolicyError, match="not trained on roboloop's engine yet.*roboloop plan"):
        policy_config("pi0", {}, None, "cpu")
    with pytest.raises(LeRobotPolicyError, match="no_such_option"):
        train(_cfg(recorded, tmp_path / "x", policy_config={"no_such_option": 1}))
    # LeRobot's optimiser options are lerobot-train's: here they would do nothing, so they are refused
    with pytest.raises(LeRobotPolicyError, match="optimizer_lr, optimizer_lr_backbone would do nothing here"):
        policy_config("act", {"optimizer_lr": 1e-5, "optimizer_lr_backbone": 1e-5}, None, "cpu")
    with pytest.raises(LeRobotPolicyError, match="scheduler_warmup_steps would do nothing"):
        policy_config("diffusion", {"scheduler_warmup_steps": 10}, None, "cpu")
    assert policy_config("act", {}, None, "cpu").pretrained_backbone_weights is None  # never a download


def test_a_batch_is_max_samples_whatever_the_task_strings_length(recorded, tmp_path):
    """LeRobot's policies pack no backbone tokens: the VLA's max_tokens must not cut their batches short (it did, by
    the task string's bytes, 16 per sample here: over a budget of 8, or 2 samples under one of 32); a recipe that
    sets it for them is refused (it would do nothing)."""
    from pydantic import ValidationError

    from roboloop.training.distributed import DistEnv
    from roboloop.training.train import Trainer

    with pytest.raises(ValidationError, match="max_tokens=8 would do nothing"):
        _cfg(recorded, tmp_path / "out", max_tokens=8, max_samples=4)
    cfg = _cfg(recorded, tmp_path / "out", max_samples=4)
    trainer = Trainer(cfg, DistEnv(0, 1, 0, torch.device("cpu")))
    try:
        assert [len(trainer.pipe.next().keys) for _ in range(3)] == [4, 4, 4]
    finally:
        trainer.stream.close()


def test_every_type_lerobot_registers_trains_or_has_its_reason():
    import lerobot.policies  # noqa: F401  (registers LeRobot's policy configs)
    from lerobot.configs.policies import PreTrainedConfig

    from roboloop.policies.lerobot_types import REFUSED, SUPPORTED

    known = set(PreTrainedConfig.get_known_choices())
    assert {"act", "diffusion", "vqbet", "smolvla", "pi0"} <= known
    assert known - set(SUPPORTED) - set(REFUSED) == set(), "a LeRobot type with neither support nor a reason"


def test_json_lists_become_the_tuples_lerobots_config_saver_needs(tmp_path):
    """A recipe's JSON/YAML gives lists; LeRobot's config declares tuples (crop_shape, whose default is None, and
    down_dims) and its saver fails on a list, which surfaced only when a run wrote its folder at the end."""
    from roboloop.policies.lerobot import policy_config

    pcfg = policy_config("diffusion", {"crop_shape": [84, 84], "down_dims": [16, 32]}, None, "cpu")
    assert pcfg.crop_shape == (84, 84) and pcfg.down_dims == (16, 32)
    pcfg._save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["crop_shape"] == [84, 84]
