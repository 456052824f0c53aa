"""Registry task: register a model version with its lineage, then run the promotion gate."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact

from roboloop import stages
from roboloop.lineage import Lineage
from roboloop.receipts import Decision, ModelRef
from tasks.common import NO_CACHE, retry_if_transient


@task(name="register", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=retry_if_transient,
      cache_policy=NO_CACHE)
def register_task(model: ModelRef, lineage: Lineage, name: str, registry: str | None = None, margin: float = 0.05,
                  promote: bool = True) -> Decision:
    """Idempotent: weights already registered are not uploaded again."""
    d = stages.register(model, lineage, name, registry, margin, promote)
    md = f"### Registry `{d.registry}`\n\n`{name}` **v{d.version}**" + (" (already registered)" if d.reused else "")
    if promote:
        md += f"\n\n- promoted: **{d.promoted}**\n- {d.reason}\n- champion: v{d.champion}"
    create_markdown_artifact(md, key="registry-decision")
    return d
