"""Receipts: small, typed, immutable records of what a stage produced and how to recognise it.

Stages hand each other receipts, never bare dicts. A receipt names its output (path) and its
content identity (a DVC-compatible md5 for folders, the sha256 of model weights, the sha256 of
an evaluation report): caches key on these identities, never on paths or alias strings, and a
cache hit is trusted only after the output is checked against them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Receipt(BaseModel):
    model_config = ConfigDict(frozen=True)

    def identity(self) -> str:  # pragma: no cover - every receipt overrides it
        raise NotImplementedError


class DatasetRef(Receipt):
    """A LeRobot dataset on local disk."""

    path: str = Field(description="local dataset folder")
    md5: str = Field(description="DVC md5 of the folder (what `dvc add` records)")
    format: Literal["v2.0", "v2.1", "v3.0"] = Field(description="LeRobot codebase version")
    num_episodes: int = Field(ge=0, description="episodes")
    num_frames: int = Field(ge=0, description="frames")
    fps: float = Field(gt=0, description="frames per second")
    source: str | None = Field(None, description="where it came from: a folder, an s3:// URI, or the md5 it was "
                               "converted from")
    tracked: bool = Field(False, description="DVC-tracked (and pushed) at `path`.dvc")

    def identity(self) -> str:
        return self.md5


class ExecutionSettings(BaseModel):
    """How a policy is run: stored with the model so evaluation and the registry use what it was validated with."""

    model_config = ConfigDict(frozen=True)

    execute_steps: int = Field(4, ge=1, description="actions of each predicted chunk executed before re-planning")
    inference_steps: int | None = Field(None, ge=1, description="denoising steps at inference (None: the model's)")


class ModelRef(Receipt):
    """A trained model folder (model.safetensors, policy.json, stats.json, metrics.jsonl, its family's files)."""

    path: str = Field(description="model folder")
    weights_sha256: str = Field(description="sha256 of model.safetensors: the model's identity")
    md5: str = Field(description="DVC md5 of the folder (checkpoints and liveness files excluded)")
    dataset_md5: str = Field(description="md5 of the dataset it was trained on")
    family: str = Field("vla", description="its policy family (roboloop.policies), which loads it")
    config: dict[str, Any] = Field(description="the training config it was trained with")
    metrics: dict[str, Any] = Field(default_factory=dict, description="first/final loss, steps, throughput")
    execution: ExecutionSettings = Field(default_factory=ExecutionSettings, description="how it runs")
    registry: str | None = Field(None, description="registry URI when it came from one")
    name: str | None = Field(None, description="registry model name")
    version: int | None = Field(None, description="registry version")
    tracked: bool = False

    def identity(self) -> str:
        return self.weights_sha256


class Checkpoints(Receipt):
    """A training run's kept checkpoints, exported as model folders (what the loop's `select` chooses among):
    cached, because a run restored from DVC comes back without its checkpoints/."""

    run_weights_sha256: str = Field(description="the run's final weights: the run's identity")
    steps: list[int] = Field(description="the step of each export")
    models: list[ModelRef] = Field(description="the exports, oldest first")

    def identity(self) -> str:
        return self.run_weights_sha256


class EvalSummary(Receipt):
    """One evaluation run: its own folder, the counts the promotion gate uses, the settings it ran with."""

    run_dir: str = Field(description="this evaluation's own folder (report.json, eval.png, videos/)")
    report_sha256: str = Field(description="sha256 of report.json")
    policy: str = Field(description="what was evaluated, as given (expert, random, a folder, registry:NAME@v3)")
    policy_id: str = Field(description="its identity: weights sha256, or expert/random")
    task: str
    episodes: int = Field(ge=1)
    successes: int = Field(ge=0)
    success_rate: float
    ci_low: float
    ci_high: float
    mean_length: float | None = None
    env_steps_per_s: float | None = None
    seed: int = 0
    execution: ExecutionSettings = Field(default_factory=ExecutionSettings)
    plot: str | None = None
    videos: list[str] = Field(default_factory=list)
    outcomes: str | None = Field(None, description="success (1) or not (0) of each episode in start order: the "
                                 "same initial states for every policy evaluated on this task and seed (paired gate)")
    planned_episodes: int | None = Field(None, description="when it stopped early: the episodes it would have run")
    stopped_early: str | None = Field(None, description="why it stopped early (the gate's decision was certain)")
    looks: int | None = Field(None, description="run with the early stop: the paired tests it planned, the gate's "
                              "final one included; the gate tests at alpha / looks")
    reused: bool = Field(False, description="this call reused an earlier run's result (its run_dir), checked: the "
                         "same weights, recipe and code")
    perturbations: dict | None = Field(None, description="--perturb: factor -> level -> success, Wilson interval, "
                                       "paired drop from nominal and outcomes on the same episodes")
    latency: list[dict] | None = Field(None, description="--latency: per setting (0 ms, measured p50/p99, given ms) "
                                       "the success with the latency charged in simulated time, paired with nominal")
    initial_states: str | None = Field(None, description="each episode's initial state (its state and instruction) "
                                       "as 8 hex digits, in episode order: the gate pairs runs that agree on these")
    initial_states_sha256: str | None = Field(None, description="sha256 of initial_states: one name for the set")
    envelope: dict | None = Field(None, description="--envelope robot: actions the robot's envelope refused or "
                                  "clamped, and the env steps played")

    def identity(self) -> str:
        return self.report_sha256


class OfflineSummary(Receipt):
    """One offline evaluation: a model's action-chunk error on the held-out episodes of the dataset it was
    trained on (for data without a simulator twin); per-episode errors for the paired offline gate."""

    run_dir: str = Field(description="its own folder (offline.json, open_loop.png)")
    report_sha256: str = Field(description="sha256 of offline.json")
    policy_id: str = Field(description="weights sha256 of the model scored")
    dataset_md5: str = Field(description="the dataset whose held-out episodes were scored")
    episodes: list[int] = Field(description="the held-out episodes scored")
    samples: int = Field(ge=0, description="frames scored")
    stride: int = Field(ge=1)
    seed: int = 0
    mse_norm: float = Field(description="mean normalised chunk MSE over the samples (lower is better)")
    per_episode: dict[str, float] = Field(description="normalised chunk MSE per held-out episode (its index)")
    action_names: list[str] = Field(default_factory=list)
    mae: list[float] = Field(default_factory=list, description="per action dimension, physical units")
    mae_norm: list[float] = Field(default_factory=list, description="per action dimension, / the action std")
    plot: str | None = None
    baselines: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="trivial predictors scored on the same frames ({name: {mse_norm, "
        "per_episode}}): mean_action, previous_action; a first model must beat the better one")

    def identity(self) -> str:
        return self.report_sha256

    def best_baseline(self) -> tuple[str, dict[str, Any]] | None:
        return min(self.baselines.items(), key=lambda kv: kv[1]["mse_norm"]) if self.baselines else None

    def gate_record(self) -> dict[str, Any]:
        """What the registry keeps for the promotion gate (lineage `offline_eval`)."""
        return self.model_dump(include={"dataset_md5", "episodes", "stride", "seed", "mse_norm", "per_episode",
                                        "baselines"})


class Decision(Receipt):
    """What the registry did with a model: its version, and whether the promotion gate made it champion."""

    registry: str
    name: str
    version: int
    reused: bool = Field(False, description="the same weights were already registered under this version")
    promoted: bool | None = Field(None, description="None: registered without running the gate")
    reason: str = Field("", description="the gate's reason")
    champion: int | None = Field(None, description="the champion after the decision")
    champion_before: int | None = Field(None, description="the champion before it")
    time: float | None = Field(None, description="when the gate decided (epoch seconds)")

    def identity(self) -> str:
        return f"{self.registry}#{self.name}@{self.version}"
