"""`observation.environment_state` as an input of LeRobot's policies, as `lerobot-train` feeds it (LeRobot's ENV
feature: PushT's keypoints, a scene's tracked poses): the dataset, written by LeRobot's own writer, has a state and
the scene's state and no camera. roboloop's batch must carry it as `LeRobotDataset` gives it (with Diffusion's
previous frame too) and give the same loss on the same weights; LeRobot must read the trained folder and act on its
own frame as roboloop does; offline scoring, the server and the Evaluator in LeRobot's PushT-keypoints env hand it
the scene's state; where none is observed the policy says so; `env_state_input` says what it does.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from roboloop.training.config import TrainConfig
from roboloop.training.train import train
from tests.conformance.cases import LEROBOT_QUIET, lerobot_writer
from tests.unit.policies.pairs import assert_same_loss, lerobot_batch, roboloop_batch, seeded_loss

pytestmark = LEROBOT_QUIET
ENV = "observation.environment_state"
E = 5
CONFIGS = {"act": {"dim_model": 32, "dim_feedforward": 64, "n_encoder_layers": 1, "n_decoder_layers": 1,
                   "n_heads": 2, "latent_dim": 8, "chunk_size": 5, "n_action_steps": 5},
           "diffusion": {"down_dims": [16, 32], "horizon": 8, "n_action_steps": 4, "diffusion_step_embed_dim": 16,
                         "num_inference_steps": 2, "n_groups": 4}}
TOKEN = "e" * 32


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("env_state") / "ds"
    lerobot_writer({}, {}, ["push the T"], num_episodes=3, env_state=E)(root)
    return root


def _cfg(ds, out, kind: str = "act", **kw) -> TrainConfig:
    return TrainConfig(**{"dataset": str(ds), "output_dir": str(out), "policy_type": kind,
                          "policy_config": CONFIGS[kind], "steps": 3, "max_samples": 4, "warmup_steps": 1,
                          "checkpoint_every_steps": 0, "num_workers": 1, **kw})


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_batches_carry_the_scene_state_as_lerobot_gives_it_and_give_the_same_loss(recorded, kind):
    from roboloop.policies import family
    from roboloop.training.data import V3Dataset
    from roboloop.training.train import features_of

    ds = V3Dataset(recorded, horizon=8, env_key=ENV)
    torch.manual_seed(0)
    trainable = family("lerobot").build(_cfg(recorded, "unused", kind), features_of(ds, True))
    assert trainable.needs.env_state and trainable.cfg.input_features[ENV].shape == (E,)
    assert trainable.cfg.input_features[ENV].type.name == "ENV" and not trainable.cameras
    n, horizon = trainable.needs.history, trainable.needs.horizon
    ds.horizon = horizon  # as the trainer sets it
    keys = [0, 1, 9, 20]  # an episode's first frame (Diffusion's history clamped), its second, one near an end
    ours = roboloop_batch(ds, trainable, keys, with_video=False, history=n, env_state=True)
    obs = [(i - n + 1) / 30 for i in range(n)]
    theirs = lerobot_batch(recorded, keys, {**({"observation.state": obs, ENV: obs} if n > 1 else {}),
                                            "action": [(i - n + 1) / 30 for i in range(horizon)]},
                           ("observation.state", ENV, "action", "action_is_pad"))
    assert ours[ENV].shape == ((4, n, E) if n > 1 else (4, E))
    for k in ("observation.state", ENV, "action_is_pad"):
        assert torch.equal(ours[k], theirs[k]), k
    valid = ~theirs["action_is_pad"]
    assert torch.equal(ours["action"][valid], theirs["action"][valid])
    theirs["action"][~valid] = ours["action"][~valid] = 0.0  # what is under the padding does not count
    policy = trainable.module.policy.eval()
    a = seeded_loss(policy, trainable.preprocessor, ours)[0]
    assert_same_loss(a, seeded_loss(policy, trainable.preprocessor, theirs)[0])
    # and the scene's state counts: another one gives another loss
    c = seeded_loss(policy, trainable.preprocessor, {**ours, ENV: ours[ENV] + 3.0})[0]
    assert abs(c - a) > 1e-4


def test_act_reads_the_scene_state_in_lerobot_offline_and_served(recorded, tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    from roboloop.offline import evaluate_offline
    from roboloop.policies import load_policy
    from roboloop.policies.lerobot import LeRobotPolicyError
    from roboloop.policies.obs import Obs
    from roboloop.serving.client import PolicyClient, RemotePolicy, ServerError
    from roboloop.serving.server import ServeConfig, Server

    out = tmp_path / "act"
    train(_cfg(recorded, out, val_fraction=0.34))
    run = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["run"]
    assert run["sample_order"] == {"sample_order": "uniform"}  # no camera: lerobot-train's order (auto)
    policy = ACTPolicy.from_pretrained(str(out))  # LeRobot's own loaders
    assert policy.config.env_state_feature is not None and policy.config.env_state_feature.shape == (E,)
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(out))
    item = LeRobotDataset("conformance/writer", root=recorded)[9]
    batch = {k: v for k, v in item.items() if k.startswith("observation.")}
    theirs = post(policy.eval().select_action(pre({**batch, "task": item["task"]})))
    ours = load_policy(out)
    assert ours.env_state_dim == E
    obs = Obs(item["observation.state"][None], {}, [item["task"]], item[ENV][None])
    chunk = ours.act(obs)
    assert chunk.shape == (1, 5, 6) and torch.allclose(chunk[:, 0], theirs, atol=1e-5), (chunk[:, 0], theirs)
    with pytest.raises(LeRobotPolicyError, match=f"reads {ENV} \\({E} values\\).*has none"):
        ours.act(Obs(obs.state, {}, obs.instructions))
    with pytest.raises(LeRobotPolicyError, match="with 5 values, the observation has 3"):
        ours.act(Obs(obs.state, {}, obs.instructions, obs.env_state[:, :3]))

    report = evaluate_offline(recorded, out, "validation", output_dir=tmp_path / "offline")
    assert len(report.episodes) == 1 and np.isfinite(report.mse_norm)

    with Server(ServeConfig(str(out), port=0), TOKEN) as srv:
        url = f"serve://127.0.0.1:{srv.port}"
        with PolicyClient(url, token=TOKEN) as c:
            assert c.info()["env_state_dim"] == E
            r = c.act(obs.state.numpy(), {}, [""], env_state=obs.env_state.numpy())
            assert np.allclose(np.asarray(r.actions), chunk.numpy(), atol=1e-6)
            with pytest.raises(ServerError, match="env_state: the model reads observation.environment_state"):
                c.act(obs.state.numpy(), {}, [""])
            r = c.act(obs.state.numpy(), {}, [""], env_state=obs.env_state.numpy())  # still serving
        remote = RemotePolicy(url, token=TOKEN)
        try:  # the Evaluator's client sends the observation's scene state
            assert remote.env_state_dim == E and torch.allclose(remote.act(obs), chunk, atol=1e-6)
        finally:
            remote.close()


def test_env_state_input_says_what_it_does(recorded, tmp_path):
    from roboloop.policies.lerobot import LeRobotPolicyError

    # off: ACT is left with the state alone, which LeRobot's own check refuses
    with pytest.raises(LeRobotPolicyError, match="act cannot train on this dataset: .*environment state"):
        train(_cfg(recorded, tmp_path / "off", env_state_input="off"))
    plain = tmp_path / "plain"
    lerobot_writer({}, {"observation.image": (24, 24)}, ["pick"], num_episodes=2)(plain)
    with pytest.raises(LeRobotPolicyError, match=f"env_state_input on: the dataset has no {ENV}"):
        train(_cfg(plain, tmp_path / "on", env_state_input="on"))
    with pytest.raises(ValueError, match="family vla does not read observation.environment_state"):
        TrainConfig(dataset=str(recorded), env_state_input="on")


@pytest.mark.slow
def test_act_on_pushts_keypoints_in_lerobots_env_in_fp32_and_bf16(tmp_path):
    """LeRobot's PushT with `obs_type=environment_state_agent_pos` observes its 16 keypoint values: an ACT trained on
    data with those features acts there through the Evaluator, in fp32 and (where the CPU multiplies bf16
    natively) in bf16 (`roboloop evaluate --precision bf16`), refused with the reason elsewhere."""
    from roboloop import availability
    from roboloop.availability import MissingCapability
    from roboloop.evaluation.config import EvalConfig
    from roboloop.evaluation.run import run_evaluation

    lerobot_writer({}, {}, ["push the T"], num_episodes=2, env_state=16, dims=(2, 2))(tmp_path / "ds")
    train(_cfg(tmp_path / "ds", tmp_path / "act", steps=2))

    def evaluate(policy: str, precision: str, out: str):
        return run_evaluation(EvalConfig(task="lerobot:pusht?obs_type=environment_state_agent_pos", policy=policy,
                                         episodes=1, num_envs=1, videos=0, precision=precision,
                                         output_dir=str(tmp_path / out)))

    report = evaluate(str(tmp_path / "act"), "fp32", "fp32")
    assert report.episodes == 1 and report.backend == "gymnasium" and report.precision == "fp32"
    native = availability.cpu_bf16()
    if native is None:
        with pytest.raises(MissingCapability, match="neither AMX nor AVX512-BF16"):
            evaluate(str(tmp_path / "act"), "bf16", "bf16")
    else:
        report = evaluate(str(tmp_path / "act"), "bf16", "bf16")
        assert report.episodes == 1 and report.precision == f"bf16 ({native})"
        with pytest.raises(ValueError, match="precision bf16: the random policy has no network"):
            evaluate("random", "bf16", "random")
