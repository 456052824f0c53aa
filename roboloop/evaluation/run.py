"""Entry points shared by the CLI and the Prefect tasks: evaluate a policy, collect demonstrations."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from roboloop.evaluation.config import DEFAULT_EXECUTE_STEPS, CollectConfig, EvalConfig, task_spec

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
    from roboloop.evaluation.evaluator import evaluate, progress_printer
    from roboloop.evaluation.policies import fits, make_policy, reads_cameras, reads_env_state, served_policy
    from roboloop.policies.precision import require_acting_precision
    from roboloop.sim import make_env
    from roboloop.sim.factors import renders
    from roboloop.sim.registry import load

    ran = require_acting_precision(cfg.precision, cfg.device)  # refused before any env is made

    # a policy that reads observation.environment_state: roboloop's tasks observe their scene's state for it (what
    # `collect --environment-state` records); another task either has it among its observations or the policy says
    policy: Any = None
    env: Any = None
    try:
        if cfg.policy.startswith("serve://"):  # one connection: asked what the model reads, then acting
            policy = served_policy(cfg.policy, cfg.precision)
        reads = bool(policy.env_state_dim) if policy is not None else reads_env_state(cfg.policy)
        spec = task_spec(cfg.task)
        overrides = {"privileged_obs": True} if spec.env_state_names is not None and reads else None
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
        if spec.fingerprints:  # the assets the task ships, as its episodes saw them
            report.asset_hashes = {k: v for ref in spec.fingerprints for k, v in load(ref)().items()}
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
    from roboloop.evaluation.policies import ExpertPolicy, NoisyPolicy, make_policy
    from roboloop.evaluation.rollouts import write_v21
    from roboloop.sim import make_env

    env = make_env(cfg.task, cfg.num_envs, cfg.device, cfg.seed, camera=cfg.camera, overrides=_recording(cfg))
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


def _recording(cfg: CollectConfig) -> dict[str, object]:
    """What a recording asks of the task's env, of what it takes: the train split of layouts (evaluation plays the
    test split), several instructions per layout, the scene state observed, failed layouts replayed, and for DAgger
    an expert that labels another actor's states (its labeller cannot integrate that actor's lag)."""
    wanted: dict[str, object] = {"layout_split": "train", "instructions_per_layout": cfg.instructions_per_layout,
                                 "privileged_obs": cfg.environment_state, "retry_failed": cfg.retry_failed,
                                 "expert_labels_others": cfg.policy != "expert"}
    accepts = task_spec(cfg.task).accepts
    return {k: v for k, v in wanted.items() if k in accepts and (v or k == "instructions_per_layout")}


def _envelope(cfg: Any, env: Any) -> Any:
    """`envelope robot`: the envelope `roboloop robot` would apply to a simulated robot of this task."""
    if cfg.envelope != "robot":
        return None
    from roboloop.serving.envelope import for_task

    return for_task(env, action_names(env.task, env.action_dim))


def action_names(task: str, action_dim: int) -> list[str]:
    """A task's action names as a robot would call them (LeRobot's schema where the task has one)."""
    return task_spec(task).names("action", action_dim)


def task_schema(task: str) -> tuple[str, list[str] | None, list[str] | None, list[str] | None]:
    """(robot_type, state names, action names, environment-state names) of what `collect` records on `task`
    (names None: numbered)."""
    spec = task_spec(task)
    listed = (spec.state_names, spec.action_names, spec.env_state_names)
    return (spec.robot_type, *(list(n) if n is not None else None for n in listed))  # type: ignore[return-value]


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
