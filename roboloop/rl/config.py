"""Typed RL configuration: one pydantic model for the CLI, the flow (a Prefect form) and the run."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, Field, model_validator


def reward_mode(task: str, reward: str) -> str:
    """The reward an RL run trains on ("task" or "progress"): `progress` where the task has a progress reward (its
    spec says; the reach tasks do)."""
    from roboloop.sim.registry import task as task_spec

    has_progress = task_spec(task).progress_reward
    if reward == "progress" and not has_progress:
        from roboloop.errors import RoboloopError
        from roboloop.sim.registry import tasks

        having = ", ".join(t for t, s in tasks().items() if s.progress_reward)
        raise RoboloopError(f"reward=progress: {task} has no progress reward ({having} do); use reward=task")
    return "progress" if reward == "auto" and has_progress else ("task" if reward == "auto" else reward)


class RLRecipe(BaseModel):
    """How to fine-tune (the flow's parameter; the policy and output folder are added by `RLConfig`)."""
    # cache keys (roboloop.keys): what shapes the output, and what only changes how fast or how often
    KEYED: ClassVar[frozenset[str]] = frozenset({
        "clip", "critic_warmup_updates", "denoise_steps", "entropy_coef", "env_steps", "env_workers",
        "envs_per_worker", "epochs", "execute_steps", "final_std", "freeze_backbone", "gae_lambda", "gamma",
        "grad_clip", "init_std", "is_cap", "learner_device", "lr", "max_staleness", "max_std", "min_std",
        "minibatch", "mode", "noise", "reward", "reward_scale", "rollout_device", "seed", "segment_decisions",
        "segments_per_update", "target_kl", "task", "value_coef", "value_lr", "x0"})
    NOT_KEYED: ClassVar[frozenset[str]] = frozenset({
        "checkpoint_every", "env_cpus", "keep_last", "learner_gpus", "learner_threads", "placement", "ray_address",
        "resume", "rollout_gpus"})


    task: str = Field("Roboloop-Reach-Color-v0", description="Isaac Lab task the policy acts in")
    mode: Literal["sync", "async"] = Field(
        "async", description="sync: collect, then train, alternating; async: environments, action generation and "
        "training overlap, rollouts carry their weights version and staleness is bounded")
    env_steps: int = Field(40_000, ge=1, description="budget: environment steps (all envs) before the run stops")
    env_workers: int = Field(2, ge=1, description="Isaac Lab processes (Ray actors)")
    envs_per_worker: int = Field(32, ge=1, description="vectorised envs in each worker")
    execute_steps: int = Field(4, ge=1, description="actions of each sampled chunk executed before re-planning")
    segment_decisions: int = Field(16, ge=1, description="decisions (chunks) per env in one rollout segment")
    segments_per_update: int = Field(2, ge=1, description="segments the learner trains on per update")
    max_staleness: int = Field(1, ge=0, description="async: the most weights versions a rollout may lag the "
                               "learner; older segments are dropped (sync is always 0)")
    epochs: int = Field(4, ge=1, description="PPO passes over each update's data")
    minibatch: int = Field(128, ge=1, description="decisions per gradient step")
    lr: float = Field(1e-4, gt=0, description="learning rate of the VLA's weights")
    value_lr: float = Field(1e-3, gt=0, description="learning rate of the value head and the noise scales")
    gamma: float | None = Field(
        None, gt=0, le=1, description="discount per environment step (default: 0.5 with the progress reward, "
        "which already scores each action by its own effect, so a short horizon lowers the variance at no cost; "
        "0.99 with the task's reward)")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda (bias against variance of the advantages)")
    clip: float = Field(0.2, gt=0, description="PPO ratio clip")
    is_cap: float = Field(2.0, ge=1, description="cap of the importance weight pi_prox / pi_behaviour (async)")
    value_coef: float = Field(0.5, ge=0, description="weight of the value loss")
    reward: Literal["auto", "task", "progress"] = Field(
        "auto", description="task: the task's own reward; progress (Roboloop-Reach tasks): the decrease of the "
        "distance to the named ball each step, plus the success bonus (potential-based shaping of the task's "
        "-distance reward: same optimal policies, far less variance); auto: progress where the task has it")
    reward_scale: float = Field(0.1, gt=0, description="rewards are multiplied by this before GAE (the critic "
                                "learns returns of order 1)")
    entropy_coef: float = Field(0.0, ge=0, description="bonus on the injected noise's entropy")
    target_kl: float = Field(0.05, gt=0, description="stop an update's epochs once the approximate KL exceeds it")
    grad_clip: float = Field(1.0, gt=0, description="gradient norm clip, applied to policy and critic apart")
    noise: Literal["chain", "final"] = Field(
        "final", description="where the policy's Gaussian noise goes: every denoising step (flow-noise, the whole "
        "chain is the action) or only the executed actions after a deterministic denoising from x_0")
    x0: Literal["sample", "zero"] = Field(
        "sample", description="where each chunk's denoising starts: a draw from N(0, I), as behaviour cloning "
        "samples (the draw is not scored, so which mode it picks is not credited), or 0: the policy is then "
        "a Gaussian around one deterministic chunk and all its exploration is the scored noise; the fine-tuned "
        "model keeps acting from 0 (its config's initial_noise)")
    init_std: float = Field(1.0, gt=0, description="initial std of the injected noise (normalised action units). "
                            "Large on purpose: PPO's trust region moves the mean by a fraction of it per update, "
                            "and the evaluated policy is the noise-free mean")
    final_std: float | None = Field(
        None, gt=0, description="anneal the noise's std cap log-linearly from init_std to this over the env-step "
        "budget (None: constant). Not a default: on the reach bench annealing 0.5 -> 0.1 gained 8 points where a "
        "constant 0.5 gained 25, since PPO's trust region (and so each update's step) shrinks with the noise")
    min_std: float = Field(0.02, gt=0, description="lower clamp of the learned noise std")
    max_std: float = Field(2.0, gt=0, description="upper clamp of the learned noise std")
    denoise_steps: int | None = Field(None, ge=1, description="K denoising steps (default: the model's)")
    critic_warmup_updates: int = Field(2, ge=0, description="first updates train only the value head")
    freeze_backbone: bool = Field(False, description="train only the action head, the noise and the value head")
    seed: int = Field(0, description="seed of the workers' torch generators and the envs' layouts")
    learner_device: str = Field("cpu", description="cpu or cuda", json_schema_extra={"enum": ["cpu", "cuda"]})
    rollout_device: str = Field("cpu", description="cpu or cuda", json_schema_extra={"enum": ["cpu", "cuda"]})
    learner_threads: int | None = Field(
        None, ge=1, description="torch threads of a CPU learner (default: every core in sync mode, where it runs "
        "alone; in async mode the cores the environment and rollout workers leave, at least 1)")
    placement: Literal["colocated", "spread"] = Field(
        "colocated", description="Ray placement of the workers: pack them on one node, or spread across nodes")
    env_cpus: float = Field(1.0, gt=0, description="Ray CPUs reserved per environment worker")
    learner_gpus: float = Field(0.0, ge=0, description="Ray GPUs for the learner (1 with learner_device=cuda)")
    rollout_gpus: float = Field(0.0, ge=0, description="Ray GPUs for the rollout worker")
    checkpoint_every: int = Field(5, ge=0, description="updates between checkpoints (0: only at the end)")
    keep_last: int = Field(2, ge=1, description="checkpoints kept (the newest)")
    resume: bool = Field(True, description="continue from the newest checkpoint in output_dir")
    ray_address: str | None = Field(None, description="an existing Ray cluster (ray://..., 'auto'); default: start "
                                    "a local one for this run and stop it afterwards")

    @model_validator(mode="after")
    def _check(self) -> RLRecipe:
        if self.min_std > self.max_std:
            raise ValueError(f"min_std {self.min_std} > max_std {self.max_std}")
        if self.gamma is None:
            self.gamma = 0.5 if reward_mode(self.task, self.reward) == "progress" else 0.99
        if self.learner_device == "cuda" and self.learner_gpus == 0:
            self.learner_gpus = 1.0
        if self.rollout_device == "cuda" and self.rollout_gpus == 0:
            self.rollout_gpus = 1.0
        return self

    def discount(self) -> float:
        """gamma, resolved (the validator fills a None)."""
        return 0.99 if self.gamma is None else self.gamma

    # what a resumed run may change (how long, how often to save, where it runs)
    RESUMABLE_CHANGES: ClassVar[frozenset[str]] = frozenset({
        "env_steps", "checkpoint_every", "keep_last", "resume", "ray_address", "placement", "env_cpus",
        "learner_threads",
        "learner_gpus", "rollout_gpus", "learner_device", "rollout_device", "output_dir"})


class RLConfig(RLRecipe):
    policy: str = Field(description="model folder or registry reference (registry:NAME@ALIAS|VERSION) to start from")
    output_dir: str = Field("artifacts/rl", description="checkpoints, metrics and the fine-tuned model")

    def changed_fields(self, saved: dict) -> list[str]:
        now = self.model_dump(mode="json")
        return sorted(k for k in now if k not in self.RESUMABLE_CHANGES and k in saved and saved[k] != now[k])
