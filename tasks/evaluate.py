"""Evaluation task: the simulator runs in a child process group (one Isaac Lab sim per process)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from roboloop import stages
from roboloop.evaluation.config import EvalRecipe, OfflineRecipe
from roboloop.receipts import DatasetRef, EvalSummary, ModelRef, OfflineSummary
from tasks.common import NO_CACHE, artifact_key, png_markdown, receipts, relay, video_markdown


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(policy: str | ModelRef, recipe: EvalRecipe, against: str | None = None,
                  margin: float = 0.05) -> EvalSummary:
    """`recipe.episodes` episodes (fewer with `recipe.early_stop` once the paired decision against `against`'s
    champion is certain); keyed on the policy's weights (aliases resolved first) + recipe + code."""
    s = stages.evaluate(policy, recipe, cache=receipts(), on_line=relay("[eval] "), against=against, margin=margin)
    if s.reused:
        get_run_logger().info("reused the evaluation in %s (checked: the same weights, recipe and code); change the "
                              "seed or the episodes to play new ones", s.run_dir)
    get_run_logger().info("%s", outcome_line(s))
    publish_evaluation(s)
    return s


@task(name="evaluate-offline", cache_policy=NO_CACHE)
def evaluate_offline_task(model: ModelRef, data: DatasetRef, recipe: OfflineRecipe) -> OfflineSummary:
    """Action-chunk error on the episodes the model held out (data without a simulator twin)."""
    s = stages.evaluate_offline(model, data, recipe, cache=receipts())
    key = artifact_key("eval-offline", model.weights_sha256[:12])
    create_table_artifact([{"action": n, "mae": round(a, 4), "mae_norm": round(b, 3)}
                           for n, a, b in zip(s.action_names, s.mae, s.mae_norm, strict=False)], key=key,
                          description=f"held-out episodes {s.episodes}: normalised chunk MSE {s.mse_norm:.4f} "
                                      f"over {s.samples} frames")
    plot = png_markdown(s.plot, "open loop: predicted vs recorded actions")
    if plot:
        create_markdown_artifact(f"### Open loop on held-out episodes\n\n{plot}", key=key + "-plot")
    return s


def outcome_line(s: EvalSummary) -> str:
    """The result in one readable line (what the run log ends with)."""
    line = (f"{s.policy} on {s.task}: {s.successes}/{s.episodes} = {s.success_rate:.1%} succeeded "
            f"(95% CI {s.ci_low:.1%}-{s.ci_high:.1%}, execute_steps {s.execution.execute_steps}, seed {s.seed})")
    return line + (f"; {s.stopped_early}" if s.stopped_early else "")


def publish_evaluation(s: EvalSummary) -> None:
    """A rounded results table and a report (plot and playable rollout videos inlined, so any browser that
    can reach the Prefect UI shows them), both keyed by policy and task. A cached evaluation publishes them
    again from its receipt."""
    key = artifact_key("eval", s.policy, s.task)
    create_table_artifact([{"policy": s.policy, "task": s.task, "episodes": s.episodes, "successes": s.successes,
                            "success_rate": round(s.success_rate, 3), "ci_low": round(s.ci_low, 3),
                            "ci_high": round(s.ci_high, 3), "execute_steps": s.execution.execute_steps,
                            "seed": s.seed, "run": s.run_dir}], key=key, description=outcome_line(s))
    parts = [f"### {s.policy} on {s.task}", "", f"**{s.success_rate:.1%}** succeeded ({s.successes}/{s.episodes}, "
             f"95% CI {s.ci_low:.1%}-{s.ci_high:.1%})" + (f"; {s.stopped_early}" if s.stopped_early else ""), ""]
    plot = png_markdown(s.plot and f"{s.run_dir}/eval.png", f"success of {s.policy}")
    if plot:
        parts += [plot, ""]
    videos = [v for v in (video_markdown(p, Path(p).stem) for p in s.videos) if v]
    if videos:
        parts += ["**Rollouts** (one failure among them whenever an episode failed)", "", *videos]
    sheet = png_markdown(f"{s.run_dir}/contact.png", "contact sheet: a row of frames per rollout")
    if sheet:
        parts += ["", sheet, ""]
    parts += robustness_markdown(s)
    create_markdown_artifact("\n".join(parts), key=key + "-report", description=f"{s.policy} on {s.task}")


def robustness_markdown(s: EvalSummary) -> list[str]:
    """Perturbations (a table, the chart, rollouts under the worst factor) and latency, paired with nominal."""
    from roboloop.evaluation.perturb import worst

    parts: list[str] = []
    if s.perturbations:
        parts += ["", "**Perturbed** (the same episodes; drop: nominal minus perturbed)", "",
                  "| factor | level | success | 95% CI | drop |", "|---|---|---|---|---|"]
        parts += [f"| {f} | {lv} | {c['success_rate']:.1%} | {c['ci_low']:.1%}-{c['ci_high']:.1%} | {c['drop']:+.1%} |"
                  for f, levels in s.perturbations.items() for lv, c in levels.items()]
        chart = png_markdown(f"{s.run_dir}/perturbations.png", "success per perturbation")
        parts += ["", chart] if chart else []
        if (w := worst(s.perturbations)) is not None:
            clips = sorted((Path(s.run_dir) / "perturb" / f"{w[0]}={w[1]}" / "videos").glob("*.mp4"))
            shown = [v for v in (video_markdown(str(c), f"{w[0]}={w[1]}: {c.stem}") for c in clips) if v]
            parts += ["", f"**Worst: {w[0]}={w[1]}**", "", *shown] if shown else []
    if s.latency:
        parts += ["", "**Latency charged in simulated time**", "", "| setting | ms | steps late | success | drop |",
                  "|---|---|---|---|---|"]
        parts += [f"| {r['setting']} | {r['ms']:g} | {r['delay_steps']} | {r['success_rate']:.1%} | {r['drop']:+.1%} |"
                  for r in s.latency]
    return parts
