"""Data stage tasks: ingest (+ validate, record demos if asked, DVC) and convert."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from roboloop import stages
from roboloop.datasets.config import ConvertConfig
from roboloop.datasets.report import DatasetDefectError, Report
from roboloop.evaluation.config import CollectConfig
from roboloop.receipts import DatasetRef
from tasks.common import NO_CACHE, artifact_key, receipts, relay, retry_if_transient
from tasks.events import dataset_added, dataset_arrived


def _publish_report(source: str, report: Report) -> None:
    create_markdown_artifact(f"### Validation of `{source}`\n\n```\n{report.human()}\n```", key="validation-report",
                             description="roboloop validate")
    rows = [{"code": d.code, "severity": d.severity, "file": d.file or "", "episode": "" if d.episode is None
             else d.episode, "field": d.field or "", "message": d.message} for d in report.defects + report.warnings]
    if rows:
        create_table_artifact(rows, key="validation-defects", description=f"{len(rows)} finding(s) in {source}")


@task(name="ingest-validate", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=retry_if_transient,
      cache_policy=NO_CACHE)
def ingest_task(source: str, collect: CollectConfig | None = None, deep: bool = False,
                track: bool = True) -> DatasetRef:
    """Download (S3) or register (folder) and validate; a defective dataset fails with its report."""
    from roboloop.datasets.validate import validate

    try:
        ref = stages.ingest(source, deep=deep, collect=collect, track=track, on_line=relay("[collect] "))
    except DatasetDefectError as e:
        _publish_report(source, e.report)
        raise
    _publish_report(source, validate(ref.path))
    return ref


@task(name="convert", cache_policy=NO_CACHE)
def convert_task(raw: DatasetRef, cfg: ConvertConfig, track: bool = True) -> DatasetRef:
    """v2.x -> v3.0, keyed on the raw dataset's md5 + config + code version (checked, never blindly reused)."""
    ref = stages.convert(raw, cfg, cache=receipts(), track=track)
    create_markdown_artifact(f"v3.0 dataset `{ref.path}`: {ref.num_episodes} episodes, {ref.num_frames} frames, "
                             f"DVC md5 `{ref.md5}` (from `{raw.md5}`)", key=artifact_key("dataset", ref.md5[:12]))
    dataset_added(ref, "convert")
    return ref


@task(name="watch", cache_policy=NO_CACHE)
def watch_task(location: str) -> list[str]:
    """New or changed datasets in `location` since the last look, each announced as `roboloop.dataset.arrived`."""
    from roboloop.datasets.watch import changes
    from roboloop.settings import settings

    new = changes(location, Path(settings().cache_dir) / "watch" / f"{stages.slug(location, 64)}.json")
    for path in new:
        dataset_arrived(path, location)
    print(f"{len(new)} new or changed dataset(s) in {location}" + "".join(f"\n  {p}" for p in new))
    return new
