"""Data stage tasks: collect, ingest + validate, convert, DVC tracking."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from roboloop import dvc
from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.ingest import ingest
from roboloop.datasets.validate import DatasetDefectError
from roboloop.evaluation.run import CollectConfig, collect_in_subprocess
from tasks.common import NO_CACHE, content_key, relay, retry_if_transient


@task(name="collect", cache_policy=NO_CACHE)
def collect_task(cfg: CollectConfig) -> str:
    """Scripted-expert demonstrations (only when the raw dataset does not exist yet)."""
    if (Path(cfg.dst) / "meta" / "info.json").exists():
        return cfg.dst
    r = collect_in_subprocess(cfg, on_line=relay("[collect] "))
    create_markdown_artifact(f"Collected **{r['episodes']}** expert episodes of `{cfg.task}` "
                             f"(expert success {r['expert_success_rate']:.1%}) into `{r['dst']}`.", key="collect")
    return r["dst"]


@task(name="ingest-validate", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=retry_if_transient,
      cache_policy=NO_CACHE)
def ingest_task(source: str, cache_dir: str = ".roboloop/cache", deep: bool = False) -> dict:
    """Download (S3) or register (folder) and validate; a defective dataset fails with its report."""
    result = ingest(source, cache_dir=cache_dir, strict=False, deep=deep)
    report = result.report
    rows = [{"code": d.code, "file": d.file or "", "episode": "" if d.episode is None else d.episode,
             "field": d.field or "", "message": d.message} for d in report.defects]
    create_markdown_artifact(f"### Validation of `{source}`\n\n```\n{report.human()}\n```", key="validation-report",
                             description="roboloop validate")
    if rows:
        create_table_artifact(rows, key="validation-defects", description=f"{len(rows)} defect(s) in {source}")
    if not report.ok:
        raise DatasetDefectError(report)
    return result.to_dict()


def _convert_key(ctx, params) -> str:
    return content_key("convert", params["raw_hash"], params["cfg"].model_dump(), params["dst"])


@task(name="convert", cache_key_fn=_convert_key, persist_result=True)
def convert_task(src: str, dst: str, raw_hash: str, cfg: ConvertConfig) -> str:
    """v2.1 -> v3.0 (cached on the raw content hash + config + code version)."""
    import shutil

    out = Path(dst)
    if out.exists():
        shutil.rmtree(out)  # a previous, different conversion: the cache said this one is new
    return str(convert(src, out, cfg.model_copy(update={"progress": False})))


@task(name="dvc-track", cache_policy=NO_CACHE)  # DVC's own state db makes an unchanged re-add cheap
def dvc_track_task(path: str, push: bool = True) -> dict:
    """`dvc add` + push; returns the md5 that downstream cache keys and lineage use."""
    t = dvc.track(path, push=push)
    return {"path": str(t.path), "dvc_file": str(t.dvc_file), "md5": t.md5}
