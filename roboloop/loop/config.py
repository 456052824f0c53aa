"""The closed loop's configuration: `LoopConfig` and the models it nests that are the loop's own (`DaggerConfig`,
`SelectRecipe`). Its named presets are functions in `roboloop.loop.presets`; the loop itself is `roboloop.loop.run`.

`LoopConfig` is what the `closed-loop` flow runs: a preset named in its deployment (`nightly_gpu()` for the
nightly one, `demo()` for closed-loop-cpu and `make demo`, `ci()` for CI's fresh-clone check), the few settings
people change and any overrides settled into it (`roboloop.loop.form.settle`), or a whole config given as `cfg`.
Fields the loop decides itself (where each stage writes, which dataset a model trains on, which
policy an evaluation runs) are not parameters.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from roboloop.datasets.config import ConvertConfig
from roboloop.evaluation.config import CollectConfig, EvalRecipe, OfflineRecipe
from roboloop.rl.config import RLRecipe
from roboloop.serving.check import ServeCheckRecipe
from roboloop.training.config import LaunchConfig, TrainRecipe


class DaggerConfig(BaseModel):
    """One DAgger round after the first pass: the policy acts, the scripted expert labels what it visited, the
    labels join the data as a new version, and training continues from the previous weights."""

    episodes: int = Field(64, ge=1, description="policy rollouts labelled by the expert per round")
    num_envs: int = Field(32, ge=1, description="vectorised envs while collecting them")
    steps: int = Field(400, ge=1, description="optimizer steps each round continues training for")
    lr: float = Field(5e-4, gt=0, description="peak learning rate of a round's continued training")
    warmup_steps: int = Field(0, ge=0, description="steps a round's learning rate ramps up over (its optimizer "
                              "starts afresh)")


class SelectRecipe(BaseModel):
    """Which of a training run's models goes on: its kept checkpoints (`train.keep_last`, one every
    `train.checkpoint_every_steps`) and its final model, each played on the same validation episodes of the
    loop's task, drawn with `seed` (the loop's `eval.seed` draws the reported ones, so the pick never sees them);
    the best (ties: the later step) is evaluated, gated and registered. Training can run past its best: on the
    SO-101, a checkpoint 500 steps before the end picked 60% where the final model picked 28% (docs/guides/so101.md)."""

    episodes: int = Field(48, ge=1, description="validation episodes per candidate")
    seed: int = Field(1, description="seeds the validation episodes; must differ from eval.seed")


class LoopConfig(BaseModel):
    source: str = Field("data", description="raw dataset: a folder or s3://bucket/prefix (LeRobot v2.0/v2.1/v3.0)")
    collect_if_missing: CollectConfig | None = Field(
        None, description="record scripted-expert demonstrations into `source` when that folder does not exist")
    convert: ConvertConfig = Field(default_factory=lambda: ConvertConfig(progress=False),
                                   description="v3 file size / episode caps")
    train: TrainRecipe = Field(default_factory=TrainRecipe, description="model preset, steps, precision, ...")
    launch: LaunchConfig | None = Field(None, description="ranks and nodes; empty: what the work pool's job sets")
    evaluation: Literal["simulator", "offline"] = Field(
        "simulator", description="simulator: roll the policy out in `eval.task`; offline: data with no simulator "
        "twin (real-robot recordings): score action chunks on the episodes training held out (train.val_fraction)")
    eval: EvalRecipe = Field(default_factory=EvalRecipe, description="task, episodes, execution settings")
    offline: OfflineRecipe = Field(default_factory=OfflineRecipe, description="how to score offline "
                                   "(evaluation: offline)")
    baseline: bool = Field(True, description="also evaluate a random policy on the same episodes; a first version "
                           "becomes champion only if it beats it (without it, no first version is promoted)")
    baseline_episodes: int | None = Field(16, ge=1, description="the random policy's episodes (the first N of the "
                                          "policy's; each runs to the time limit); empty: all of them")
    model_name: str = Field("reach-vla", description="registry model name")
    margin: float = Field(0.05, ge=0, le=1, description="promotion non-inferiority margin on the success rate")
    track: bool = Field(True, description="DVC-track (and push) datasets and models")
    select: SelectRecipe | None = Field(
        None, description="after each training, play its kept checkpoints and final model on validation episodes "
        "(a seed of their own) and carry the best on (empty: the final model)")
    rounds: int = Field(1, ge=1, description="1: one pass; N: N-1 DAgger rounds after it (Roboloop tasks with a "
                        "scripted expert, a v2.x source)")
    dagger: DaggerConfig = Field(default_factory=DaggerConfig, description="what each DAgger round does")
    rl: RLRecipe | None = Field(
        None, description="after the rounds, fine-tune the last model with RL (flow-noise PPO on Ray) in the task "
        "the loop evaluates in; the result is evaluated and put through the promotion gate like a round, its "
        "lineage naming the version it started from (empty: no RL)")
    serve_check: ServeCheckRecipe | None = Field(
        None, description="at the end, serve the version the loop registered (roboloop serve on 127.0.0.1, a child "
        "process) and play the first episodes of its evaluation through the server, the simulator as the robot: the "
        "summary says whether each ended as in-process and how long a chunk took (empty: no check)")

    def _check_offline(self) -> None:
        """evaluation 'offline': held-out episodes to score, and nothing that needs a simulator."""
        if self.train.val_fraction <= 0:
            raise ValueError("evaluation 'offline' scores the episodes training holds out: set train.val_fraction "
                             "> 0 (e.g. 0.1)")
        if self.rounds > 1:
            raise ValueError("rounds > 1 (DAgger) needs a simulator and a scripted expert; evaluation 'offline' "
                             "has neither")
        for name, what in (("rl", "fine-tunes in a simulator"),
                           ("serve_check", "drives the simulator through the server")):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} {what}; evaluation 'offline' has none (leave {name} empty)")

    def _check_unused(self) -> None:
        """Refuse, never ignore: settings of a part of the loop that this configuration does not run."""
        unused = {"dagger": ("rounds is 1: no DAgger round runs", self.rounds == 1),
                  "offline": ("evaluation is 'simulator': nothing is scored offline", self.evaluation == "simulator"),
                  "baseline_episodes": ("baseline is off: no random policy is evaluated", not self.baseline)}
        for name, (why, idle) in unused.items():
            default = type(self).model_fields[name].get_default(call_default_factory=True)
            if idle and getattr(self, name) != default:
                raise ValueError(f"{name} is set but would do nothing: {why} (leave it at its default)")

    @model_validator(mode="after")
    def _offline_needs_held_out_episodes(self) -> LoopConfig:
        self._check_unused()
        if self.evaluation == "offline":
            self._check_offline()
        if self.select is not None:
            if self.evaluation != "simulator":
                raise ValueError("select plays checkpoints in the simulator; evaluation 'offline' has none (leave "
                                 "select empty)")
            if self.select.seed == self.eval.seed:
                raise ValueError(f"select.seed {self.select.seed} equals eval.seed: the checkpoint would be picked on "
                                 "the very episodes it is then reported on; give select a seed of its own")
            every = self.train.checkpoint_every_steps
            if not 0 < every < self.train.steps:
                raise ValueError(f"select picks among kept checkpoints, and train.checkpoint_every_steps {every} "
                                 f"keeps none before step {self.train.steps}: set it below train.steps")
        if self.rl is not None and self.rl.task != self.eval.task:
            raise ValueError(f"rl.task {self.rl.task!r} differs from eval.task {self.eval.task!r}: the loop fine-tunes "
                             "in the task it evaluates in and gates on")
        return self
