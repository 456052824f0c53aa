"""Entry points shared by the CLI and the Prefect tasks: evaluate a policy, collect demonstrations."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from roboloop.evaluation.config import (
    DEFAULT_EXECUTE_STEPS,
    ROBOLOOP_TASKS,
    SIM2SIM_TASKS,
    CollectConfig,
    EvalConfig,
)

if TYPE_CHECKING:
    from roboloop.evaluation.evaluator import EvalReport

__all__ = ["CollectConfig", "EvalConfig", "collect", "collect_in_subprocess", "evaluate_in_subprocess",
           "run_evaluation"]


def _stop_rule(cfg: EvalConfig):
    """The early stop against the champion's outcomes (`stop_against`), and how many paired tests it plans (the
    gate's final one included); (None, None) without it."""
    if not cfg.stop_against or cfg.save_rollouts:
        return None, None
    from roboloop.binomial import paired_stop
    from roboloop.evaluation.evaluator import LOOK_EVERY

    return paired_stop(cfg.stop_against, cfg.episodes, LOOK_EVERY, cfg.stop_margin)


def run_evaluation(cfg: EvalConfig) -> EvalReport:
    from roboloop.evaluation.assets import hashes
    from roboloop.evaluation.evaluator import evaluate, progress_printer
    from roboloop.evaluation.gym_env import make_env
    from roboloop.evaluation.perturb import renders
    from roboloop.evaluation.policies import fits, make_policy, reads_cameras, reads_env_state, served_policy
    from roboloop.policies.precision import require_acting_precision

    ran = require_acting_precision(cfg.precision, cfg.device)  # refused before any env is made

    # a policy that reads observation.environment_state: roboloop's tasks observe their scene's state for it (what
    # `collect --environment-state` records); another task either has it among its observations or the policy says
    policy: Any = None
    env: Any = None
    try:
        if cfg.policy.startswith("serve://"):  # one connection: asked what the model reads, then acting
            policy = served_policy(cfg.policy, cfg.precision)
        reads = bool(policy.env_state_dim) if policy is not None else reads_env_state(cfg.policy)
        overrides = {"privileged_obs": True} if cfg.task in (*ROBOLOOP_TASKS, *SIM2SIM_TASKS) and reads else None
        # a policy that reads no image (the scripted baselines, a state-only model): unless a video or rollout is asked
        # for, render nothing (the episodes, seeded by layout, are the same ones; an SO-101 random baseline runs ~2x
        # faster without its two cameras, the demo's model ~1.5x), unless a suite moves a camera (the env without
        # cameras could not)
        blind = not cfg.videos and not cfg.save_rollouts and not renders(cfg.perturb) and \
            not (policy.camera_keys if policy is not None else reads_cameras(cfg.policy))
        env = make_env(cfg.task, cfg.num_envs, cfg.device, cfg.seed, camera=not blind, overrides=overrides)
        policy = fits(policy, env, cfg.policy) if policy is not None else \
            make_policy(cfg.policy, env, cfg.device, cfg.seed, cfg.precision)
        stop, looks = _stop_rule(cfg)
        report, trajs = evaluate(env, policy, cfg.episodes, cfg.execute_steps or DEFAULT_EXECUTE_STEPS, cfg.videos,
                                 cfg.output_dir, record_rollouts=bool(cfg.save_rollouts), seed=cfg.seed, stop=stop,
                                 progress=progress_printer("[progress] evaluating"), label=cfg.shown_as(),
                                 envelope=_envelope(cfg, env))
        report.precision = ran
        report.looks = looks  # the gate's final test spends the same alpha / looks as each look did
        if hasattr(policy, "served"):  # served: which model versions produced the chunks, how fast they came
            report.served = policy.served()
        if cfg.perturb or cfg.latency:
            from roboloop.evaluation.suites import run_suites

            run_suites(env, policy, cfg, report, cfg.execute_steps or DEFAULT_EXECUTE_STEPS)
        if cfg.task.startswith("Roboloop-"):
            report.asset_hashes = hashes()
            if "-SO101-" in cfg.task:
                from roboloop.evaluation.so101_asset import fingerprint

                report.asset_hashes.update(fingerprint())
        if cfg.save_rollouts:
            from roboloop.evaluation.rollouts import write_v3

            report.rollouts = str(write_v3(trajs, cfg.save_rollouts, env.fps))
        Path(cfg.output_dir, "report.json").write_text(report.to_json(full=True))
        return report
    finally:
        if callable(getattr(policy, "close", None)):  # a served policy: its connection closed, not dropped
            policy.close()
        if env is not None:
            env.close()


def collect(cfg: CollectConfig) -> tuple[Path, EvalReport]:
    from roboloop.evaluation.evaluator import evaluate, progress_printer
    from roboloop.evaluation.gym_env import make_env
    from roboloop.evaluation.policies import ExpertPolicy, NoisyPolicy, make_policy
    from roboloop.evaluation.rollouts import write_v21

    # demonstrations are recorded on the train split of layouts; evaluation plays the test split
    overrides: dict[str, object] | None = None
    if cfg.task in ROBOLOOP_TASKS:
        overrides = {"layout_split": "train"}
        if cfg.task.startswith("Roboloop-Reach-"):
            overrides["instructions_per_layout"] = cfg.instructions_per_layout
        if cfg.environment_state:
            overrides["privileged_obs"] = True
        if cfg.retry_failed:
            overrides["retry_failed"] = cfg.retry_failed
        if cfg.policy != "expert" and cfg.task.startswith("Roboloop-SO101-"):
            overrides["expert_labels_others"] = True  # DAgger: its labeller cannot integrate another actor's lag
    env = make_env(cfg.task, cfg.num_envs, cfg.device, cfg.seed, camera=cfg.camera, overrides=overrides)
    try:
        if cfg.perturb:  # recorded as the robot meets it under the factor; the labels stay the expert's
            from roboloop.evaluation.perturb import Perturbed, parse

            (factor, level), = parse(cfg.perturb)
            env = Perturbed(env, factor, level, cfg.seed, share=cfg.perturb_share)
        expert = ExpertPolicy(env)
        dagger = cfg.policy != "expert"
        actor = make_policy(cfg.policy, env, cfg.device, cfg.seed) if dagger else expert
        if cfg.noise > 0:
            actor = NoisyPolicy(actor, cfg.noise, seed=cfg.seed, low=env.action_low, high=env.action_high)
        # The recorded action is always the expert's at the visited state (DART, DAgger); a clean expert's own
        # executed action is that label already.
        report, trajs = evaluate(env, actor, cfg.episodes, execute_steps=cfg.execute_steps if dagger else 1,
                                 videos=0, record_rollouts=True, seed=cfg.seed,
                                 labeler=expert if (dagger or cfg.noise > 0) else None,
                                 progress=progress_printer("[progress] recording"))
        keep = [t for t in trajs if t["success"] or not cfg.only_success or dagger]
        robot_type, names, action_names, env_names = task_schema(cfg.task)
        dst = write_v21(keep, cfg.dst, env.fps, robot_type=robot_type, state_names=names,
                        action_names=action_names, env_state_names=env_names)
        return dst, report
    finally:
        env.close()


# what a reach task's `privileged` observation holds (see ReachColorEnvCfg.privileged_obs)
ENV_STATE_NAMES = ["red_x", "red_y", "green_x", "green_y", "blue_x", "blue_y", "tip_x", "tip_y"]
# what the SO-101 task's `privileged` observation holds (recorded when CollectConfig.environment_state is on): the
# cube's centre (m, the arm's base frame), its yaw (rad) and the point between the jaw pads (m)
SO101_ENV_STATE_NAMES = ["cube_x", "cube_y", "cube_z", "cube_yaw", "grasp_x", "grasp_y", "grasp_z"]
# LeRobot's so101_follower motors (state and action `<motor>.pos`), as `lerobot-record` names them
SO101_NAMES = [f"{m}.pos" for m in ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll",
                                    "gripper")]
# what LeRobot 0.6.1's `lerobot-record` writes as robot_type for an SO-101 follower (its robot's `name`; recordings
# made with LeRobot before the SO-100/101 classes merged say "so101_follower")
SO101_ROBOT_TYPE = "so_follower"


def _envelope(cfg: Any, env: Any) -> Any:
    """`envelope robot`: the envelope `roboloop robot` would apply to a simulated robot of this task."""
    if cfg.envelope != "robot":
        return None
    from roboloop.serving.envelope import for_task

    return for_task(env, action_names(env.task, env.action_dim))


def action_names(task: str, action_dim: int) -> list[str]:
    """A task's action names as a robot would call them (LeRobot's schema where the task has one)."""
    if task in (*ROBOLOOP_TASKS, *SIM2SIM_TASKS):
        action = task_schema(task)[2]
        if action is not None and len(action) == action_dim:
            return list(action)
    return [f"action_{i}" for i in range(action_dim)]


def task_schema(task: str) -> tuple[str, list[str] | None, list[str] | None, list[str] | None]:
    """(robot_type, state names, action names, environment-state names) of what `collect` records on `task`
    (names None: numbered)."""
    if task in ("Roboloop-SO101-PickCube-v0", *SIM2SIM_TASKS):
        return SO101_ROBOT_TYPE, SO101_NAMES, SO101_NAMES, SO101_ENV_STATE_NAMES
    if task not in ROBOLOOP_TASKS:
        return "roboloop", None, None, None
    state = ["q_shoulder", "q_elbow", "qd_shoulder", "qd_elbow"]
    if not task.endswith("-Vision-v0"):
        state += ["tip_x", "tip_y", "red_x", "red_y", "green_x", "green_y", "blue_x", "blue_y",
                  "red_dx", "red_dy", "green_dx", "green_dy", "blue_dx", "blue_dy"]
    action = ["d_shoulder", "d_elbow"] if "-Joint-" in task else ["d_tip_x", "d_tip_y"]
    return "roboloop_reach_arm", state, action, ENV_STATE_NAMES


# children start through one public module (roboloop.procs); the names stay importable from here
from roboloop.procs import ChildFailed  # noqa: E402,F401
from roboloop.warm import run_entry  # noqa: E402,F401


def evaluate_in_subprocess(cfg: EvalConfig, on_line=print, timeout_s: float | None = None) -> dict:
    """Evaluate in a child process group; returns the report dict (also in `cfg.output_dir`/report.json)."""
    return run_entry("evaluate", cfg, Path(cfg.output_dir), on_line, timeout_s,
                      f"evaluation of {cfg.policy} on {cfg.task}")


def collect_in_subprocess(cfg: CollectConfig, on_line=print, timeout_s: float | None = None) -> dict:
    """Record demonstrations in a child process group; returns its JSON summary."""
    work = Path(cfg.dst).parent / f".{Path(cfg.dst).name}.collect"
    try:
        return run_entry("collect", cfg, work, on_line, timeout_s, f"collecting {cfg.task} demos")
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
