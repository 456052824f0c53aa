"""Registry task: register a model version with its lineage, then run the promotion gate."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact

from roboloop.lineage import Lineage
from roboloop.registry import Registry
from tasks.common import NO_CACHE, retry_if_transient


@task(name="register", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=retry_if_transient,
      cache_policy=NO_CACHE)
def register_task(name: str, model_dir: str, lineage: Lineage, registry: str | None = None,
                  margin: float = 0.05, promote: bool = True) -> dict:
    """Idempotent: a model whose md5 is already registered is not uploaded again."""
    reg = Registry(registry)
    existing = [v for v in reg.versions(name) if lineage.model_md5 and
                reg.lineage(name, v).get("model_md5") == lineage.model_md5]
    version = existing[-1] if existing else reg.register(name, model_dir, lineage.model_dump(mode="json"))
    out = {"registry": reg.uri, "name": name, "version": version, "reused": bool(existing)}
    if promote:
        d = reg.promote(name, version, margin=margin)
        out |= {"promoted": d.promoted, "reason": d.reason, "champion": d.champion_after}
    md = f"### Registry `{reg.uri}`\n\n`{name}` **v{version}**" + (" (already registered)" if existing else "")
    if promote:
        md += f"\n\n- promoted: **{out['promoted']}**\n- {out['reason']}\n- champion: v{out['champion']}"
    create_markdown_artifact(md, key="registry-decision")
    return out
