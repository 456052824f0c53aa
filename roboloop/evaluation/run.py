"""Entry points shared by the CLI and the Prefect tasks: evaluate a policy, collect demonstrations."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from roboloop.evaluation.config import DEFAULT_EXECUTE_STEPS, ROBOLOOP_TASKS, CollectConfig, EvalConfig

if TYPE_CHECKING:
    from roboloop.evaluation.evaluator import EvalReport

__all__ = ["CollectConfig", "EvalConfig", "collect", "collect_in_subprocess", "evaluate_in_subprocess",
           "run_evaluation"]


def run_evaluation(cfg: EvalConfig) -> EvalReport:
    from roboloop.evaluation.assets import hashes
    from roboloop.evaluation.evaluator import evaluate, progress_printer
    from roboloop.evaluation.gym_env import make_env
    from roboloop.evaluation.policies import make_policy

    env = make_env(cfg.task, cfg.num_envs, cfg.device, cfg.seed)
    try:
        policy = make_policy(cfg.policy, env, cfg.device, cfg.seed)
        stop = None
        if cfg.stop_against and not cfg.save_rollouts:
            from roboloop.binomial import early_decision
            from roboloop.evaluation.evaluator import LOOK_EVERY

            ref, margin = cfg.stop_against, cfg.stop_margin
            stop = lambda outcomes: early_decision(outcomes, ref, cfg.episodes, LOOK_EVERY, margin)  # noqa: E731
        report, trajs = evaluate(env, policy, cfg.episodes, cfg.execute_steps or DEFAULT_EXECUTE_STEPS, cfg.videos,
                                 cfg.output_dir, record_rollouts=bool(cfg.save_rollouts), seed=cfg.seed, stop=stop,
                                 progress=progress_printer("[progress] evaluating"))
        if cfg.task.startswith("Roboloop-"):
            report.asset_hashes = hashes()
        if cfg.save_rollouts:
            from roboloop.evaluation.rollouts import write_v3

            report.rollouts = str(write_v3(trajs, cfg.save_rollouts, env.fps))
        Path(cfg.output_dir, "report.json").write_text(report.to_json(full=True))
        return report
    finally:
        env.close()


def collect(cfg: CollectConfig) -> tuple[Path, EvalReport]:
    from roboloop.evaluation.evaluator import evaluate, progress_printer
    from roboloop.evaluation.gym_env import make_env
    from roboloop.evaluation.policies import ExpertPolicy, NoisyPolicy, make_policy
    from roboloop.evaluation.rollouts import write_v21

    # demonstrations are recorded on the train split of layouts; evaluation plays the test split
    overrides = {"instructions_per_layout": cfg.instructions_per_layout, "layout_split": "train"} \
        if cfg.task in ROBOLOOP_TASKS else None
    env = make_env(cfg.task, cfg.num_envs, cfg.device, cfg.seed, camera=cfg.camera, overrides=overrides)
    try:
        expert = ExpertPolicy(env)
        dagger = cfg.policy != "expert"
        actor = make_policy(cfg.policy, env, cfg.device, cfg.seed) if dagger else expert
        if cfg.noise > 0:
            actor = NoisyPolicy(actor, cfg.noise, seed=cfg.seed)
        # The recorded action is always the expert's at the visited state (DART, DAgger); a clean expert's own
        # executed action is that label already.
        report, trajs = evaluate(env, actor, cfg.episodes, execute_steps=cfg.execute_steps if dagger else 1,
                                 videos=0, record_rollouts=True, seed=cfg.seed,
                                 labeler=expert if (dagger or cfg.noise > 0) else None,
                                 progress=progress_printer("[progress] recording"))
        keep = [t for t in trajs if t["success"] or not cfg.only_success or dagger]
        names, action_names = _feature_names(cfg.task)
        dst = write_v21(keep, cfg.dst, env.fps, robot_type="roboloop_reach_arm", state_names=names,
                        action_names=action_names,
                        env_state_names=ENV_STATE_NAMES if cfg.task in ROBOLOOP_TASKS else None)
        return dst, report
    finally:
        env.close()


# what a Roboloop task's `privileged` observation holds (see ReachColorEnvCfg.privileged_obs)
ENV_STATE_NAMES = ["red_x", "red_y", "green_x", "green_y", "blue_x", "blue_y", "tip_x", "tip_y"]


def _feature_names(task: str) -> tuple[list[str] | None, list[str] | None]:
    """State and action names of roboloop's tasks (None for others)."""
    if task not in ROBOLOOP_TASKS:
        return None, None
    state = ["q_shoulder", "q_elbow", "qd_shoulder", "qd_elbow"]
    if not task.endswith("-Vision-v0"):
        state += ["tip_x", "tip_y", "red_x", "red_y", "green_x", "green_y", "blue_x", "blue_y",
                  "red_dx", "red_dy", "green_dx", "green_dy", "blue_dx", "blue_dy"]
    return state, (["d_shoulder", "d_elbow"] if "-Joint-" in task else ["d_tip_x", "d_tip_y"])


# children start through one public module (roboloop.procs); the names stay importable from here
from roboloop.procs import ChildFailed, run_entry  # noqa: E402,F401


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
