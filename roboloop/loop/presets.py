"""The loop's named presets, as functions (`roboloop loop --preset NAME`, the deployments' `preset`): each returns a
whole `LoopConfig`; `for_source` runs one on a user's own dataset."""

from __future__ import annotations

from typing import Literal

from roboloop.evaluation.config import CollectConfig, EvalRecipe
from roboloop.loop.config import LoopConfig, SelectRecipe
from roboloop.serving.check import ServeCheckRecipe
from roboloop.training.config import LaunchConfig, TrainRecipe


def demo() -> LoopConfig:
    """`make demo`: the reach task on CPU, recorded by the scripted expert when `data/` is missing.

    What the ablations (docs/guides/recipes.md) chose: 512 demonstrations recorded with DART
    noise 0.5 (the expert's labels at the states a perturbed run visits, so the policy learns to recover),
    every layout recorded with all three instructions (the layout alone never tells which ball: the policy
    has to ground the colour word), an 8-step action chunk, and state + language only on this task (its
    state has the ball positions; the camera is what the `-Vision-` task is for, so the recording skips
    rendering), so 1,200 steps of 128 samples fit the 10-minute budget."""
    return LoopConfig(collect_if_missing=CollectConfig(episodes=512, num_envs=64, noise=0.5, instructions_per_layout=3,
                                                       camera=False),
                      train=TrainRecipe(steps=1200, max_tokens=4096, max_samples=128, with_video=False,
                                        checkpoint_every_steps=200, model_overrides={"horizon": 8}),
                      eval=EvalRecipe(episodes=48, num_envs=16, execute_steps=4),
                      serve_check=ServeCheckRecipe(episodes=16))


def vision() -> LoopConfig:
    """The vision-only reach task (`Roboloop-Reach-Color-Vision-v0`: the state is the arm's joints, the balls are only
    in the 64x64 camera image) on CPU: `demo()`'s recording with the camera, a keypoint image encoder whose
    keypoints also feed the state token, and the balls' and fingertip's positions (recorded by `collect` as
    observation.environment_state) as an auxiliary target of the image tokens; the head's (detached) prediction of
    them feeds the state token too, so the policy acts on where it sees the balls (the simulator's positions are
    only a training target, never an input).
    `bench/policy.py` runs it (collect -> train -> evaluate); a closed loop takes it as its `LoopConfig`."""
    task = "Roboloop-Reach-Color-Vision-v0"
    d = demo()
    return LoopConfig(source="data-vision", model_name="reach-vision-vla",
                      collect_if_missing=d.collect_if_missing.model_copy(update={"task": task, "camera": True}),  # type: ignore[union-attr]
                      train=d.train.model_copy(update={
                          "with_video": True, "steps": 4500, "max_tokens": 8192,  # 15 min on 2 CPU cores
                          "aux_target": "observation.environment_state", "aux_weight": 1.0,
                          "checkpoint_every_steps": 500,
                          "model_overrides": {**d.train.model_overrides, "image_encoder": "keypoints", "keypoints": 16,
                                              "keypoints_to_state": 1, "aux_to_state": 1}}),
                      eval=d.eval.model_copy(update={"task": task}))


def ci() -> LoopConfig:
    """`make demo` on a tiny budget, for CI's fresh-clone check: every stage runs."""
    return LoopConfig(collect_if_missing=CollectConfig(episodes=12, num_envs=12),
                      train=TrainRecipe(steps=40, checkpoint_every_steps=20, max_tokens=1024),
                      eval=EvalRecipe(episodes=6, num_envs=6, execute_steps=4, videos=1))


def nightly_gpu() -> LoopConfig:
    """The nightly retraining on the GPU pool: the `small` model in bf16, ranks from the job. (`precision="auto"`
    picks FP8 only on a GPU model `bench/precision.py --grid` recorded faster, and even there no linear of `small`
    (width 384) reaches the break-even, so the run trains in bf16 and its record says why.)"""
    return LoopConfig(train=TrainRecipe(preset="small", steps=20000, max_tokens=16384, max_samples=256, lr=3e-4,
                                        warmup_steps=500, precision="auto", device="auto", num_workers=8,
                                        checkpoint_every_steps=1000, checkpoint_every_minutes=30.0),
                      eval=EvalRecipe(episodes=200, num_envs=64, device="cuda", execute_steps=4, early_stop=True))


def so101() -> LoopConfig:
    """The SO-101 picks a cube (`Roboloop-SO101-PickCube-v0`, LeRobot's so101_follower schema): demonstrations by
    the scripted expert with half a degree of DART noise (a failed run's layout played up to twice more, so the kept
    runs cover the layouts the noisy expert fails on more), recorded in the `front` and `wrist` cameras at 96x128,
    and roboloop's VLA with the keypoint image encoder on both cameras (resized to 64x96; the cube is only in the
    images: the state is the arm's six joints, as on the real robot), an 8-step chunk of absolute joint targets.
    The exported weights are their average (`ema_decay` 0.999), and they act with 2 Euler steps of the denoising,
    not 4, chosen on the validation cubes (docs/guides/so101.md, "What shaped the preset", gives the commands
    that measure both). At the end the registered version is served (`roboloop serve`, a child process) and the
    first 16 test cubes are played through it, both cameras' frames crossing the wire, as a real arm's robot loop
    would be driven."""
    task = "Roboloop-SO101-PickCube-v0"
    return LoopConfig(source="data-so101", model_name="so101-pick",
                      collect_if_missing=CollectConfig(task=task, episodes=384, num_envs=16, noise=0.5,
                                                       retry_failed=2),
                      train=TrainRecipe(steps=2500, max_tokens=8192, max_samples=128, with_video=True,  # 20 min here
                                        checkpoint_every_steps=500, ema_decay=0.999,
                                        model_overrides={"horizon": 8, "image_encoder": "keypoints", "keypoints": 16,
                                                         "keypoints_to_state": 1, "image_size": [64, 96],
                                                         "inference_steps": 2}),
                      eval=EvalRecipe(task=task, episodes=48, num_envs=16, execute_steps=4),
                      select=SelectRecipe(episodes=48, seed=1), serve_check=ServeCheckRecipe(episodes=16))


def so101_ci() -> LoopConfig:
    """`so101()` on CI's budget: every stage runs on the SO-101 task, nothing is expected to pick."""
    d = so101()
    return LoopConfig.model_validate({**d.model_dump(), "source": "data-so101-ci", "model_name": "so101-ci",
                                      "collect_if_missing": {**d.collect_if_missing.model_dump(),  # type: ignore[union-attr]
                                                             "episodes": 4, "num_envs": 4},
                                      "train": {**d.train.model_dump(), "steps": 20, "checkpoint_every_steps": 10,
                                                "max_tokens": 2048},
                                      "eval": {**d.eval.model_dump(), "episodes": 2, "num_envs": 2, "videos": 1},
                                      "select": {"episodes": 2, "seed": 1}})


def cluster() -> LoopConfig:
    """The `closed-loop-cluster` deployment: `demo()`'s recipe on a team's cluster. The flow runs on the cpu pool (it
    ingests from S3, evaluates in the simulator, registers) and hands training to the gpu pool: one `train-node` run on
    each of two nodes, which meet through the run store (`ROBOLOOP_RUN_STORE`); the model comes back from there.
    `make cluster-demo` runs it on test hosts (infra/cluster_demo.py)."""
    d = demo()
    return LoopConfig.model_validate({**d.model_dump(), "source": "s3://roboloop/datasets/reach",
                                      "collect_if_missing": None, "serve_check": None,
                                      "launch": LaunchConfig(nnodes=2, nproc_per_node=1,
                                                             deployment="train-node/train-node").model_dump()})


PRESETS = {"demo": demo, "cluster": cluster, "ci": ci, "vision": vision, "nightly_gpu": nightly_gpu, "so101": so101,
           "so101_ci": so101_ci}


def for_source(cfg: LoopConfig, source: str, evaluation: Literal["simulator", "offline"] = "offline",
               model_name: str | None = None) -> LoopConfig:
    """`cfg` run on a user's own dataset (a folder anywhere or s3://...), which the loop only reads: nothing is
    recorded into it, every camera it has is fed to the model, 10% of its episodes are held out when evaluating
    offline (then no checkpoint pick: it plays them in a simulator), and the model is registered under the
    dataset's name unless one is given."""
    import re
    from pathlib import PurePosixPath

    from roboloop.s3 import is_s3

    if not is_s3(source):
        from pathlib import Path

        source = str(Path(source).expanduser().absolute())
    name = model_name or re.sub(r"[^a-z0-9]+", "-", PurePosixPath(source.rstrip("/")).name.lower()).strip("-")
    # a user's cameras are what their robot sees: feed them (the demo's reach task trains on state + language)
    train = cfg.train.model_copy(update={"with_video": True})
    if evaluation == "offline" and train.val_fraction <= 0:
        train = train.model_copy(update={"val_fraction": 0.1})
    return LoopConfig.model_validate({**cfg.model_dump(), "source": source, "collect_if_missing": None,
                                      "evaluation": evaluation, "model_name": name or "policy",
                                      "train": train.model_dump(), "select": None if evaluation == "offline"
                                      else cfg.select and cfg.select.model_dump(),
                                      "rounds": 1 if evaluation == "offline"
                                      else cfg.rounds, "rl": None if evaluation == "offline" else cfg.rl,
                                      "serve_check": None if evaluation == "offline" else cfg.serve_check})

