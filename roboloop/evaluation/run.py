"""Entry points shared by the CLI and the Prefect tasks: evaluate a policy, collect demonstrations."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from roboloop.evaluation.evaluator import EvalReport, evaluate


class EvalConfig(BaseModel):
    """What to evaluate, where, and how many episodes."""

    policy: str = Field("expert", description="expert, random, a model folder, or registry:NAME@champion|vN")
    task: str = Field("Roboloop-Reach-Color-v0", description="Isaac Lab task id (Isaac-*/Roboloop-*) or a "
                      "gymnasium id (gym_pusht/PushT-v0)")
    episodes: int = Field(50, ge=1, description="exactly this many episodes are counted")
    num_envs: int = Field(16, ge=1, description="vectorised envs")
    device: Literal["cpu", "cuda"] = Field("cpu", description="simulation and policy device")
    seed: int = 0
    execute_steps: int = Field(8, ge=1, description="actions of each predicted chunk executed before re-planning")
    videos: int = Field(2, ge=0, description="rollout mp4s to write")
    output_dir: str = Field("artifacts/eval", description="report.json, eval.png, videos/")
    save_rollouts: str | None = Field(None, description="also write the rollouts as a LeRobot v3 dataset here")


def run_evaluation(cfg: EvalConfig) -> EvalReport:
    from roboloop.evaluation.assets import hashes
    from roboloop.evaluation.gym_env import make_env
    from roboloop.evaluation.policies import make_policy

    env = make_env(cfg.task, cfg.num_envs, cfg.device, cfg.seed)
    try:
        policy = make_policy(cfg.policy, env, cfg.device, cfg.seed)
        report, trajs = evaluate(env, policy, cfg.episodes, cfg.execute_steps, cfg.videos, cfg.output_dir,
                                 record_rollouts=bool(cfg.save_rollouts), seed=cfg.seed)
        if cfg.task.startswith("Roboloop-"):
            report.asset_hashes = hashes()
        if cfg.save_rollouts:
            from roboloop.evaluation.rollouts import write_v3

            report.rollouts = str(write_v3(trajs, cfg.save_rollouts, env.fps))
        Path(cfg.output_dir, "report.json").write_text(report.to_json(full=True))
        return report
    finally:
        env.close()


class CollectConfig(BaseModel):
    """Scripted-expert demonstrations, written as a LeRobot v2.1 dataset."""

    dst: str = Field("data", description="destination folder (must not exist)")
    task: str = Field("Roboloop-Reach-Color-v0")
    episodes: int = Field(60, ge=1)
    num_envs: int = Field(16, ge=1)
    device: Literal["cpu", "cuda"] = "cpu"
    seed: int = 0
    only_success: bool = Field(True, description="keep only the expert's successful episodes")


def collect(cfg: CollectConfig) -> tuple[Path, EvalReport]:
    from roboloop.evaluation.gym_env import make_env
    from roboloop.evaluation.policies import ExpertPolicy
    from roboloop.evaluation.rollouts import write_v21

    env = make_env(cfg.task, cfg.num_envs, cfg.device, cfg.seed)
    try:
        report, trajs = evaluate(env, ExpertPolicy(env), cfg.episodes, execute_steps=1, videos=0,
                                 record_rollouts=True, seed=cfg.seed)
        keep = [t for t in trajs if t["success"] or not cfg.only_success]
        names = None
        if cfg.task == "Roboloop-Reach-Color-v0":
            names = ["q_shoulder", "q_elbow", "qd_shoulder", "qd_elbow", "tip_x", "tip_y",
                     "red_x", "red_y", "green_x", "green_y", "blue_x", "blue_y"]
        dst = write_v21(keep, cfg.dst, env.fps, robot_type="roboloop_reach_arm", state_names=names,
                        action_names=["d_shoulder", "d_elbow"] if names else None)
        return dst, report
    finally:
        env.close()


def cli_args(cfg: BaseModel) -> list[str]:
    """A pydantic config as `roboloop` CLI options (the inverse of cli._add_model_options)."""
    out: list[str] = []
    for name, value in cfg.model_dump().items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out


def _run_cli(argv: list[str], on_line, timeout_s: float | None, what: str) -> list[str]:
    """`roboloop ARGV` in a child process group (Isaac Lab keeps one simulation per process; a
    cancelled caller kills the simulator too). Returns the last output lines; raises on failure."""
    import os
    import sys

    from roboloop.procs import run_streaming

    cmd = [sys.executable, "-m", "roboloop.cli", *argv]
    code, tail = run_streaming(cmd, on_line, timeout_s, {**os.environ, "PYTHONUNBUFFERED": "1"}, what=what)
    if code != 0:
        raise RuntimeError(f"{what} failed (exit {code}): " + " | ".join(tail[-5:]))
    return tail


def evaluate_in_subprocess(cfg: EvalConfig, on_line=print, timeout_s: float | None = None) -> dict:
    """`roboloop evaluate` in a child process group; returns the report dict."""
    import json

    _run_cli(["evaluate", *cli_args(cfg)], on_line, timeout_s, f"evaluation of {cfg.policy} on {cfg.task}")
    return json.loads(Path(cfg.output_dir, "report.json").read_text())


def collect_in_subprocess(cfg: CollectConfig, on_line=print, timeout_s: float | None = None) -> dict:
    """`roboloop collect` in a child process group; returns its JSON summary."""
    import json

    tail = _run_cli(["collect", cfg.dst, *cli_args(cfg.model_copy(update={"dst": None}))], on_line, timeout_s,
                    f"collecting {cfg.task} demos")
    return json.loads(tail[-1])
