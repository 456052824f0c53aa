"""Configuration of evaluation and collection, importable without torch or a simulator."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, Field, JsonValue, model_validator

DEFAULT_EXECUTE_STEPS = 4  # chunk actions executed before re-planning, unless the model was validated otherwise


def _task_choices(schema: dict[str, JsonValue]) -> None:
    """What the Prefect UI offers (a select, not free text): the registered tasks and the families' examples (the
    CLI also takes any id a family resolves, e.g. Isaac-*); drawn when the form is, so a task module of your own
    (ROBOLOOP_TASK_MODULES) is offered too."""
    from roboloop.sim.registry import choices

    schema["enum"] = list(choices())


def _expert_task_choices(schema: dict[str, JsonValue]) -> None:
    from roboloop.sim.registry import choices

    schema["enum"] = list(choices(expert_only=True))


def task_spec(task: str):
    """The registry's spec of `task` (roboloop.sim.registry; no simulator imported)."""
    from roboloop.sim.registry import task as spec

    return spec(task)


class EvalRecipe(BaseModel):
    """How to evaluate (the task, how many episodes, how the policy runs); `EvalConfig` adds what and where."""
    # cache keys (roboloop.keys): what shapes the output, and what only changes how fast or how often
    KEYED: ClassVar[frozenset[str]] = frozenset({
        "device", "early_stop", "episodes", "execute_steps", "num_envs", "precision", "seed", "task", "videos",
        "perturb", "latency", "prefetch", "envelope"})
    NOT_KEYED: ClassVar[frozenset[str]] = frozenset({"gate_robustness", "gate_latency", "gate_envelope"})


    task: str = Field("Roboloop-Reach-Color-v0", description="a registered task (roboloop.sim.registry: roboloop's "
                      "Roboloop-*, MuJoCo-SO101-PickCube-v0, gym_pusht/PushT-v0, and any module of your own: "
                      "docs/guides/add-a-task.md), any Isaac-* task, or lerobot:<env type> (LeRobot's env configs)",
                      json_schema_extra=_task_choices)
    episodes: int = Field(50, ge=1, description="exactly this many episodes are counted")
    num_envs: int = Field(16, ge=1, description="vectorised envs")
    device: Literal["cpu", "cuda"] = Field("cpu", description="simulation and policy device")
    seed: int = Field(0, description="seeds the initial states and the policy's noise")
    execute_steps: int | None = Field(None, ge=1, description="actions of each predicted chunk executed before "
                                      "re-planning; empty: what the model was validated with (registry), else 4")
    videos: int = Field(2, ge=0, description="rollout mp4s to write")
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="a model's forward passes: fp32, or bf16 autocast where the device multiplies bf16 "
        "natively (AMX or AVX512-BF16 on a CPU; refused elsewhere), as `roboloop serve --precision bf16` acts; a "
        "scripted policy or a server (its own --precision) is refused in bf16")
    early_stop: bool = Field(False, description="in the closed loop: stop as soon as the promotion gate's paired "
                             "decision against the champion (same task, seed, execution) is certain, checked every "
                             "16 episodes (Bonferroni over the looks); `episodes` is then the most it runs. The "
                             "perturbations play the episodes it played, and with gate_robustness each of their "
                             "runs stops the same way against the champion's under that factor")
    perturb: str | None = Field(
        None, description="also play the same episodes under perturbations: FACTOR[=LEVEL],... or all (factors: "
        "obs_noise, action_noise, actuator_gain, frame_drop, frame_delay, camera_shift, brightness, instruction, "
        "object_pose, arm_pose, on the SO-101 pick: distractors, colour_swap, re-rendered where the task has cameras: "
        "camera_pose, camera_fov, and on MuJoCo-SO101-PickCube-v0 lighting; a factor alone: "
        "all its levels; all: every factor the task applies); reports success per factor and level and the "
        "paired drop from nominal")
    latency: str | None = Field(
        None, description="also play the same episodes with the policy's latency charged in simulated time: "
        "measured (the nominal run's p50 and p99 chunk times; through the server for serve://) and/or "
        "milliseconds, comma-separated (e.g. measured,50); the arm holds or finishes the previous chunk meanwhile")
    prefetch: int = Field(
        0, ge=0, description="with latency: also play each latency setting as a robot loop with prefetch (roboloop "
        "robot --prefetch): the next chunk asked for when this many actions of the executing one are left, from "
        "that step's observation, the arm going on meanwhile (rows '<setting>, prefetch N'); 0: without prefetch only")

    envelope: Literal["none", "robot"] = Field(
        "none", description="robot: every action passes the envelope roboloop robot applies (the task's action bounds "
        "as joint limits; on joints in degrees its default step, acceleration and first-target bounds per step): a "
        "target that breaks it is refused (the arm holds, its env re-plans) or, where the env cannot "
        "hold, clamped; the report counts both (envelope), so what a robot would refuse is measured before it moves. "
        "The nominal episodes only")

    gate_robustness: float | None = Field(
        None, ge=0, le=1, description="promotion also needs, under every perturbation both the challenger and the "
        "champion were evaluated with (perturb), the challenger not worse than the champion by more than this margin "
        "(paired, per factor and level); empty: the nominal episodes alone decide")
    gate_latency: bool = Field(
        False, description="promotion also needs the challenger's success at its own measured p99 latency not worse "
        "than the champion's at its own (paired; latency must include measured)")

    gate_envelope: bool = Field(
        False, description="promotion also needs the challenger refused by the robot's envelope no more often (per "
        "step) than the champion on the same episodes (envelope must be robot)")

    @model_validator(mode="after")
    def _gates_check_something(self):
        if self.gate_robustness is not None and not self.perturb:
            raise ValueError("gate_robustness would do nothing: no perturbation is evaluated (set perturb)")
        if self.gate_envelope and self.envelope != "robot":
            raise ValueError("gate_envelope would do nothing: no evaluation through the robot's envelope (set envelope "
                             "to robot)")
        if self.gate_latency and "measured" not in (self.latency or ""):
            raise ValueError("gate_latency would do nothing: it compares success at the measured p99 latency "
                             "(set latency to measured)")
        return self

    @model_validator(mode="after")
    def _suites_parse(self):
        if self.perturb:
            from roboloop.sim.factors import FACTORS, parse
            from roboloop.sim.registry import applying

            applies = task_spec(self.task).scene_factors
            for factor in dict.fromkeys(f for f, _ in parse(self.perturb, applies)):
                if FACTORS[factor].acts_on == "scene" and factor not in applies:
                    raise ValueError(f"perturb: {factor} is applied by the task's own reset or renderer; "
                                     f"{self.task} applies {', '.join(applies) or 'none'} (the tasks that apply "
                                     f"{factor}: {', '.join(applying(factor)) or 'none'})")
        if self.prefetch and not self.latency:
            raise ValueError("prefetch would do nothing: it is played with the latency settings (set latency)")
        if self.prefetch >= (self.execute_steps or DEFAULT_EXECUTE_STEPS):
            raise ValueError(f"prefetch {self.prefetch}: it asks for the next chunk with that many of the "
                             f"{self.execute_steps or DEFAULT_EXECUTE_STEPS} executed actions left (fewer, please)")
        for part in [p.strip() for p in (self.latency or "").split(",") if p.strip()]:
            if part != "measured":
                try:
                    ok = float(part) >= 0
                except ValueError:
                    ok = False
                if not ok:
                    raise ValueError(f"latency: {part!r} is neither measured nor a number of milliseconds >= 0")
        return self


class OfflineRecipe(BaseModel):
    """How to score a model without a simulator: its action chunks against the recorded ones on the episodes
    it held out (`TrainRecipe.val_fraction`)."""
    # cache keys (roboloop.keys): what shapes the output, and what only changes how fast or how often
    KEYED: ClassVar[frozenset[str]] = frozenset({"device", "plot_episodes", "seed", "stride"})
    NOT_KEYED: ClassVar[frozenset[str]] = frozenset()


    stride: int = Field(4, ge=1, description="score every stride-th frame of each held-out episode")
    device: Literal["cpu", "cuda"] = Field("cpu", description="where the model runs")
    seed: int = Field(0, description="seeds the flow-matching noise (the same for every model: paired frames)")
    plot_episodes: int = Field(3, ge=0, description="held-out episodes drawn in the open-loop plot")


class EvalConfig(EvalRecipe):
    """What to evaluate, where, and how many episodes."""

    policy: str = Field("expert", description="expert, random, a model folder, or registry:NAME@champion|vN")
    output_dir: str = Field("artifacts/eval", description="report.json, eval.png, videos/")
    save_rollouts: str | None = Field(None, description="also write the rollouts as a LeRobot v3 dataset here")
    stop_against: str | None = Field(None, description="early stop: the champion's outcomes ('1'/'0' per numbered "
                                     "episode) to pair with")
    stop_margin: float = Field(0.05, ge=0, le=1, description="early stop: the gate's non-inferiority margin")
    stop_against_perturbed: dict[str, dict[str, str]] | None = Field(
        None, description="early stop of each perturbation's run: the champion's outcomes under it (factor -> "
        "level -> '1'/'0' per numbered episode), paired with `gate_robustness` as the margin")
    stop_against_latency: str | None = Field(
        None, description="early stop of the run at the measured p99 latency: the champion's outcomes at its own "
        "('1'/'0' per numbered episode), paired with `stop_margin` (the gate's latency check)")
    label: str | None = Field(None, description="the model as people name it (reach-vla@3): the videos' captions")

    def shown_as(self) -> str:
        """The name the videos' captions give the model: the stage's (reach-vla@3), else the policy as given."""
        return self.label or (Path(self.policy).name if Path(self.policy).is_dir() else self.policy)

    @classmethod
    def of(cls, recipe: EvalRecipe, policy: str, output_dir: str, save_rollouts: str | None = None,
           stop_against: str | None = None, stop_margin: float = 0.05, label: str | None = None,
           stop_against_perturbed: dict[str, dict[str, str]] | None = None,
           stop_against_latency: str | None = None) -> EvalConfig:
        return cls(**recipe.model_dump(), policy=policy, output_dir=output_dir, save_rollouts=save_rollouts,
                   stop_against=stop_against, stop_margin=stop_margin, label=label,
                   stop_against_perturbed=stop_against_perturbed, stop_against_latency=stop_against_latency)


class CollectConfig(BaseModel):
    """Scripted-expert demonstrations, written as a LeRobot v2.1 dataset."""
    # cache keys (roboloop.keys): what shapes the output, and what only changes how fast or how often
    KEYED: ClassVar[frozenset[str]] = frozenset({
        "camera", "device", "environment_state", "episodes", "execute_steps", "instructions_per_layout", "noise",
        "num_envs", "only_success", "perturb", "perturb_share", "retry_failed", "seed", "task"})
    NOT_KEYED: ClassVar[frozenset[str]] = frozenset({"dst", "policy"})


    dst: str = Field("data", description="destination folder (must not exist)")
    task: str = Field("Roboloop-Reach-Color-v0", description="a registered task with a scripted expert",
                      json_schema_extra=_expert_task_choices)
    episodes: int = Field(60, ge=1, description="episodes recorded")
    num_envs: int = Field(16, ge=1, description="vectorised envs")
    device: Literal["cpu", "cuda"] = Field("cpu", description="simulation device")
    seed: int = Field(0, description="seeds the initial states (the recording is bit-identical per seed)")
    only_success: bool = Field(True, description="keep only the expert's successful episodes")
    instructions_per_layout: int = Field(
        1, ge=1, le=3, description="episodes recorded on each scene layout, each with another instruction (3: every "
        "colour), so the layout alone never predicts the target (Roboloop tasks; 1: a new layout every episode)")
    noise: float = Field(0.0, ge=0, description="DART: std of Gaussian noise added to the executed actions "
                         "(the recorded labels stay the expert's); 0 records the clean expert")
    retry_failed: int = Field(
        0, ge=0, description="SO-101: an env plays a failed episode's cube and start pose again, up to this many "
        "more times with new noise, before drawing the next; the noisy expert fails more on some layouts (cubes near "
        "the base), so without it the kept demonstrations thin them out (0: a new layout every episode)")
    policy: str = Field("expert", description="who acts: the scripted expert, or (DAgger) a model folder or registry "
                        "reference whose visited states the expert labels; its failures are kept too")
    execute_steps: int = Field(4, ge=1, description="a model policy's chunk actions executed before re-planning")
    camera: bool = Field(True, description="record the task's cameras as videos (False: state + language only, "
                         "much faster on CPU, where rendering is most of a step)")
    perturb: str | None = Field(
        None, description="record the demonstrations as a robot meets them under one perturbation (FACTOR=LEVEL, "
        "evaluate's factors: reworded instructions, noise, dropped frames, a scene laid out past the training range, "
        "...): what is recorded is what the perturbed robot saw, the labels stay the expert's. Trains a policy "
        "robust to it (the gate's robustness check then tells)")
    perturb_share: float = Field(1.0, gt=0, le=1, description="the share of episodes recorded under `perturb`, drawn "
                                 "per episode (the rest nominal); a scene factor applies to every episode (1)")
    environment_state: bool = Field(
        False, description="also record the simulator's scene state (the SO-101's cube pose and grasp point) as "
        "observation.environment_state: the VLA's aux_target; LeRobot's policies read it as an input unless trained "
        "with env_state_input off (a real robot does not observe it). Off, an SO-101 recording has exactly a real "
        "so101_follower's features (the -Vision- reach task always records it)")

    @model_validator(mode="after")
    def _vision_needs_its_camera(self) -> CollectConfig:
        spec = task_spec(self.task)
        if not spec.expert:
            raise ValueError(f"task: {self.task} has no scripted expert to record or label demonstrations")
        if not self.camera and not self.environment_state and not spec.state_locates_goal:
            raise ValueError(f"camera: {self.task}'s state has no target positions; its recordings need the camera "
                             "(or environment_state, which records them)")
        if self.instructions_per_layout > spec.instructions:
            raise ValueError(f"instructions_per_layout: {self.task} has {spec.instructions} instruction(s) per "
                             "layout; only tasks that name one of several targets have more")
        if self.retry_failed and not spec.replays_layouts:
            raise ValueError(f"retry_failed: {self.task} does not replay layouts")
        if self.retry_failed and self.noise == 0 and self.policy == "expert":
            raise ValueError("retry_failed: the clean expert (noise 0) would replay the same failed run; set noise")
        if self.perturb_share < 1 and not self.perturb:
            raise ValueError("perturb_share would do nothing: no perturbation is recorded (set perturb)")
        if self.perturb:
            from roboloop.sim.factors import parse

            if len(parse(self.perturb)) != 1:
                raise ValueError(f"perturb: {self.perturb!r}: a recording meets one factor at one level "
                                 "(FACTOR=LEVEL)")
        if self.environment_state and spec.env_state_names is None:
            raise ValueError(f"environment_state: {self.task} does not observe its scene's state")
        return self
