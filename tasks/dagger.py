"""DAgger tasks: the policy's rollouts labelled by the scripted expert, and the aggregated dataset version."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact

from roboloop import stages
from roboloop.evaluation.config import CollectConfig
from roboloop.loop.summary import RoundResult, plot_rounds
from roboloop.receipts import DatasetRef, ModelRef
from tasks.common import NO_CACHE, artifact_key, png_markdown, receipts, relay
from tasks.events import dataset_added


@task(name="dagger-collect", cache_policy=NO_CACHE)
def dagger_collect_task(model: ModelRef, recipe: CollectConfig, round_: int, track: bool = True) -> DatasetRef:
    """The model acts; every state it visits is recorded with the expert's action (keyed on the weights)."""
    return stages.dagger_collect(model, recipe, round_, cache=receipts(), track=track, on_line=relay("[dagger] "))


@task(name="aggregate", cache_policy=NO_CACHE)
def aggregate_task(sources: list[DatasetRef], round_: int, track: bool = True) -> DatasetRef:
    """A new dataset version: every episode of `sources`, lineage (their md5s) in its marker."""
    ref = stages.aggregate(sources, cache=receipts(), track=track)
    create_markdown_artifact(
        f"Round {round_} dataset `{ref.path}`: {ref.num_episodes} episodes (md5 `{ref.md5}`), from "
        + " + ".join(f"`{s.md5}` ({s.num_episodes} eps)" for s in sources),
        key=artifact_key("dataset-version", ref.md5[:12]))
    dataset_added(ref, "aggregate")
    return ref


@task(name="rounds-report", cache_policy=NO_CACHE)
def rounds_artifact(rounds: list[RoundResult], out_dir: str) -> str:
    """Success (with its CI) per round, as a plot and a table in the Prefect UI."""
    png = plot_rounds(rounds, Path(out_dir) / "rounds.png")
    rows = "\n".join(f"| {r.round} | {r.kind} | {r.episodes} | {r.successes}/{r.evaluated} = {r.success_rate:.1%} | "
                     f"{r.ci_low:.1%}-{r.ci_high:.1%} | v{r.version} | {r.promoted} |" for r in rounds)
    create_markdown_artifact(
        "### Success per round\n\n" + png_markdown(png, "success per round") +
        "\n\n| round | kind | episodes | success | 95% CI | registry | promoted |\n|---|---|---|---|---|---|---|\n"
        + rows,
        key="dagger-rounds", description="success with its 95% CI per round")
    return str(png)
