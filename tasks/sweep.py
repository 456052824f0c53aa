"""Checkpoint-sweep tasks: the candidates (checkpoints exported as model folders), the plot, the registration."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from roboloop import stages
from roboloop.lineage import Lineage
from roboloop.loop.sweep import Scored, best, offline_scores, plot_sweep
from roboloop.receipts import Decision, EvalSummary, ModelRef
from tasks.common import NO_CACHE, png_markdown, receipts
from tasks.register import register_task


@task(name="sweep-candidates", cache_policy=NO_CACHE)
def candidates_task(run: str) -> list[tuple[int, ModelRef]]:
    return stages.sweep_candidates(run)


@task(name="checkpoint-candidates", cache_policy=NO_CACHE)
def loop_candidates_task(model: ModelRef, track: bool) -> list[tuple[int, ModelRef]]:
    """The closed loop's pick (`LoopConfig.select`): the run's kept checkpoints as model folders, and the run."""
    from roboloop.loop.run import candidates

    return candidates(model, track, receipts())


@task(name="sweep-offline-scores", cache_policy=NO_CACHE)
def offline_scores_task(run: str, step: int, model: ModelRef) -> dict[str, float]:
    return offline_scores(run, step, model, cache=receipts())


@task(name="sweep-report", cache_policy=NO_CACHE)
def sweep_artifact(scored: list[Scored], run: str, task_id: str, agreement: dict | None = None) -> str:
    png = _plot(scored, run, task_id)
    b = best(scored)
    names = list((agreement or {}).get("scores", {}))
    rows = "\n".join(f"| {s.step} | {s.successes}/{s.episodes} = {s.success_rate:.1%} | {s.ci_low:.1%}-{s.ci_high:.1%}"
                     f" | {' | '.join(f'{s.offline[n]:.4g}' for n in names)}{' | ' if names else ''}"
                     f"{'**best**' if s is b else ''} |" for s in scored)
    head = "| step | success | 95% CI | " + "".join(f"{n} | " for n in names) + " |\n|" + "---|" * (4 + len(names))
    create_markdown_artifact(f"### Checkpoint sweep of `{run}` on {task_id}\n\n{png_markdown(png, 'success vs step')}"
                             f"\n\n{head}\n{rows}{_agreement_markdown(agreement)}", key="checkpoint-sweep",
                             description="success against the training step, and how offline scores rank them")
    return str(png)


def _agreement_markdown(agreement: dict | None) -> str:
    if not agreement or not agreement.get("scores"):
        return ""
    rows = "\n".join(f"| {n} | {a['spearman']} | {a['ci'] or '-'} | {a['p']} | {a['picks_step']} | "
                     f"{a['picked_success_rate']:.1%} | {a['regret']:+.1%} |" for n, a in agreement["scores"].items())
    note = f"\n\n{agreement['note']}" if agreement.get("note") else ""
    return ("\n\n#### Can an offline score pick the checkpoint? (Spearman's rho with the simulator's success)\n\n"
            "| offline score (lower is better) | rho | 95% CI | p (permutations) | picks step | its success | "
            f"short of the best |\n|---|---|---|---|---|---|---|\n{rows}{note}")


def _plot(scored: list[Scored], run: str, task_id: str) -> Path:
    out = stages.artifacts_root() / "sweeps"
    out.mkdir(parents=True, exist_ok=True)
    return plot_sweep(scored, out / f"{Path(run).name}.png", f"{Path(run).name} on {task_id}")


@task(name="register-best", cache_policy=NO_CACHE)
def register_best_task(model: ModelRef, ev: EvalSummary, step: int, name: str, margin: float) -> Decision:
    dataset = model.config.get("dataset", "")
    if not dataset or not Path(dataset).is_dir():
        raise FileNotFoundError(f"{model.path}: its training dataset {dataset!r} is not here; the registry needs the "
                                "dataset's md5 for the lineage (restore it with dvc pull)")
    data = stages.dataset_ref(dataset)
    lineage = Lineage.of(None, data, model, ev, configs={"sweep": {"checkpoint_step": step}})
    return register_task.fn(model, lineage, name, margin=margin)
