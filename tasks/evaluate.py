"""Evaluation task: the simulator runs in a child process group (one Isaac Lab sim per process)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_image_artifact, create_link_artifact, create_table_artifact

from roboloop.evaluation.run import EvalConfig, evaluate_in_subprocess
from tasks.common import content_key, relay

KEEP = ("policy", "task", "episodes", "successes", "success_rate", "ci_low", "ci_high", "mean_length",
        "env_steps_per_s", "backend")


def _eval_key(ctx, params) -> str:
    return content_key("evaluate", params["policy_md5"], params["cfg"].model_dump())


@task(name="evaluate", cache_key_fn=_eval_key, persist_result=True)
def evaluate_task(cfg: EvalConfig, policy_md5: str = "") -> dict:
    """Run exactly `cfg.episodes` episodes; cached on the policy's md5 (or name) + config + code."""
    report = evaluate_in_subprocess(cfg, on_line=relay("[eval] "))
    create_table_artifact([{k: report[k] for k in KEEP}], key="eval-" + cfg.policy.split("/")[-1].replace("_", "-")
                          .replace(":", "-").replace(".", "-").lower()[:40],
                          description=f"{cfg.policy} on {cfg.task}")
    if report.get("plot"):
        create_image_artifact(Path(report["plot"]).resolve().as_uri(), description=f"success rate of {cfg.policy}")
    for v in report.get("videos", []):
        create_link_artifact(Path(v).resolve().as_uri(), link_text=Path(v).name, description="rollout video")
    return {k: v for k, v in report.items() if k != "per_episode"}
