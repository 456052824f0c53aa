"""LeRobot's SmolVLA on roboloop's engine: a vision-language-action policy whose backbone comes from a local folder
(no Hub here), so the task string is an input.

roboloop's batch must carry each sample's own task string (and LeRobot's loss on it), LeRobot must read the trained
folder and act from it, and the folder must act through roboloop after it is moved to a machine without the
backbone's folder (the VLM's config and processor travel in it; its weights are in model.safetensors)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from roboloop.training.config import TrainConfig
from roboloop.training.train import train
from tests.conformance.cases import LEROBOT_QUIET, lerobot_writer
from tests.unit.policies.tiny_vlm import SMALL_SMOLVLA, tiny_smolvlm

pytestmark = LEROBOT_QUIET

CAMS = {"observation.images.front": (32, 48)}
IMAGES = {"observation.image": (24, 24)}
TASKS = ["pick the cube", "put the cube in the bowl"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("smolvla") / "ds"
    lerobot_writer(CAMS, IMAGES, TASKS, num_episodes=3)(root)
    return root


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return tiny_smolvlm(tmp_path_factory.mktemp("models") / "SmolVLM2-tiny", weights=True)


def _cfg(ds, out, vlm_dir, **kw) -> TrainConfig:
    return TrainConfig(**{"dataset": str(ds), "output_dir": str(out), "policy_type": "smolvla",
                          "policy_config": {**SMALL_SMOLVLA, "vlm_model_name": str(vlm_dir)}, "steps": 3,
                          "max_samples": 4, "warmup_steps": 1, "checkpoint_every_steps": 0, "num_workers": 1, **kw})


def test_smolvla_without_a_local_backbone_or_too_narrow_is_refused_with_the_reason(recorded, vlm, tmp_path):
    from roboloop.policies.lerobot import LeRobotPolicyError, policy_config

    with pytest.raises(LeRobotPolicyError, match="smolvla needs its SmolVLM2 backbone from a local folder.*no "
                                                 "vlm_model_name was given"):
        policy_config("smolvla", {}, None, "cpu")
    with pytest.raises(LeRobotPolicyError, match="not a folder: HuggingFaceTB/SmolVLM2-500M-Video-Instruct"):
        policy_config("smolvla", {"vlm_model_name": "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"}, None, "cpu")
    with pytest.raises(LeRobotPolicyError, match="observation.state has 6 dimensions, more than its max_state_dim=4"):
        train(_cfg(recorded, tmp_path / "narrow", vlm, policy_config={**SMALL_SMOLVLA, "vlm_model_name": str(vlm),
                                                                      "max_state_dim": 4}))
    # the folder's weights are loaded when it has them, unless told otherwise
    assert policy_config("smolvla", {"vlm_model_name": str(vlm)}, None, "cpu").load_vlm_weights is True
    assert policy_config("smolvla", {"vlm_model_name": str(vlm), "load_vlm_weights": False}, None,
                         "cpu").load_vlm_weights is False


def test_smolvla_batches_carry_each_samples_task_and_give_lerobots_loss(recorded, vlm):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from roboloop.policies import family
    from roboloop.training.data import SampleStream, V3Dataset
    from roboloop.training.packing import collate
    from roboloop.training.train import features_of

    ds = V3Dataset(recorded, horizon=5)
    torch.manual_seed(0)
    trainable = family("lerobot").build(_cfg(recorded, "unused", vlm), features_of(ds, True))
    assert trainable.reads_language and trainable.cameras == [*CAMS, *IMAGES]
    stream = SampleStream(ds, None, trainable.needs.max_text_len, num_workers=1, cameras=trainable.cameras)
    keys = [0, 12, 25, 7]  # episodes 0, 1, 2, 0: both tasks, in an order of their own
    ours = trainable.batch(collate(stream.materialize(keys), 0))
    stream.close()
    lr = LeRobotDataset("conformance/writer", root=recorded, delta_timestamps={"action": [i / 30 for i in range(5)]})
    items = [lr[k] for k in keys]
    assert ours["task"] == [it["task"] for it in items] == [TASKS[0], TASKS[1], TASKS[0], TASKS[0]]
    theirs = {k: torch.stack([it[k] for it in items]) for k in ("observation.state", "action", "action_is_pad",
                                                                   *trainable.cameras)}
    theirs["task"] = [it["task"] for it in items]
    policy = trainable.module.policy.eval()
    with torch.no_grad():
        torch.manual_seed(1)
        a, _ = policy.forward(trainable.preprocessor(ours))
        torch.manual_seed(1)
        b, _ = policy.forward(trainable.preprocessor(theirs))
        torch.manual_seed(1)
        other, _ = policy.forward(trainable.preprocessor({**ours, "task": ["open the drawer"] * 4}))
    assert abs(float(a) - float(b)) <= 2e-3 * abs(float(b)), (float(a), float(b))
    assert abs(float(other) - float(a)) > 1e-6  # the instruction is an input


def test_smolvla_trains_lerobot_reads_it_and_it_acts_where_its_backbone_folder_is_not(recorded, vlm, tmp_path):
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    from roboloop.policies import load_policy, model_info
    from roboloop.policies.obs import Obs

    out = tmp_path / "smolvla"
    train(_cfg(recorded, out, vlm))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert model_info(out).family == "lerobot" and (out / "vlm" / "tokenizer.json").is_file()
    # SmolVLA's defaults train the action expert and leave the VLM frozen: the run record counts what trained
    fresh = SmolVLAPolicy.from_pretrained(str(out))
    fresh.train()  # LeRobot freezes the VLM's parameters as it builds the policy
    assert rows[0]["run"]["parameters"] == {"total": sum(p.numel() for p in fresh.parameters()),
                                            "trainable": sum(p.numel() for p in fresh.parameters() if p.requires_grad),
                                            "finetune": {"mode": "full"}}
    assert 0 < rows[0]["run"]["parameters"]["trainable"] < rows[0]["run"]["parameters"]["total"]
    assert not list((out / "vlm").glob("*.safetensors"))  # the backbone's weights are in model.safetensors only
    item = LeRobotDataset("conformance/writer", root=recorded)[14]
    policy = SmolVLAPolicy.from_pretrained(str(out))  # LeRobot's own loaders, on this machine
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(out))
    batch = {k: v for k, v in item.items() if k.startswith("observation.")}
    action = post(policy.select_action(pre({**batch, "task": item["task"]})))
    assert action.shape == (1, 6) and torch.isfinite(action).all()

    moved = shutil.copytree(out, tmp_path / "elsewhere" / "smolvla")  # a registry download on another machine
    away = vlm.rename(vlm.with_name("gone"))
    try:
        ours = load_policy(moved)
        obs = Obs(item["observation.state"][None], {k: (item[k].permute(1, 2, 0)[None] * 255).to(torch.uint8)
                                                      for k in (*CAMS, *IMAGES)}, [item["task"]])
        torch.manual_seed(2)
        chunk = ours.act(obs)
        torch.manual_seed(2)
        assert torch.equal(ours.act(obs), chunk)  # the same noise, the same chunk
        torch.manual_seed(2)
        other = ours.act(Obs(obs.state, obs.images, ["open the drawer"]))
    finally:
        away.rename(vlm)
    assert chunk.shape == (1, 5, 6) and torch.isfinite(chunk).all()
    assert not np.allclose(chunk.numpy(), other.numpy())  # the instruction reaches the model
