"""Registry task: register a model version with its lineage, then run the promotion gate."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact

from roboloop import stages
from roboloop.lineage import Lineage
from roboloop.receipts import Decision, ModelRef
from tasks.common import NO_CACHE, artifact_key, retry_if_transient
from tasks.events import model_events


@task(name="register", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=retry_if_transient,
      cache_policy=NO_CACHE)
def register_task(model: ModelRef, lineage: Lineage, name: str, registry: str | None = None, margin: float = 0.05,
                  promote: bool = True) -> Decision:
    """Idempotent: weights already registered are not uploaded again."""
    d = stages.register(model, lineage, name, registry, margin, promote)
    model_events(d, model.weights_sha256)
    md = f"### Registry `{d.registry}`\n\n`{name}` **v{d.version}**" + (" (already registered)" if d.reused else "")
    if promote:
        md += f"\n\n- promoted: **{d.promoted}**\n- {d.reason}\n- champion: v{d.champion}"
    create_markdown_artifact(md, key="registry-decision")
    return d


@task(name="promotion-report", cache_policy=NO_CACHE)
def promotion_report_task(ref: str) -> str:
    """Markdown: the version's evaluation, its lineage (data, code, config) and the gate's last decision on it."""
    from roboloop.registry import Registry, parse_ref

    uri, name, r = parse_ref(ref)
    reg = Registry(uri)
    v = reg.resolve(name, r)
    lin = reg.lineage(name, v)
    aliases, _ = reg.aliases(name)
    decision = next((d for d in reversed(aliases.get("decisions", [])) if d.get("version") == v), {})
    ev = lin.get("eval") or {}
    rows = [("registry", f"`{name}` v{v} in `{reg.uri}`"), ("champion now", f"v{aliases.get('champion')}"),
            ("replaced", f"v{decision.get('champion_before')}"), ("gate", decision.get("reason", "n/a")),
            ("dataset (DVC md5)", f"`{lin.get('dataset_md5')}`"), ("git commit", f"`{lin.get('git_commit')}`"),
            ("parents", ", ".join(lin.get("parents") or []) or "none")]
    if ev:
        rows.insert(2, ("evaluation", f"{ev.get('successes')}/{ev.get('episodes')} on {ev.get('task')} "
                        f"(95% CI {ev.get('ci_low', 0):.1%}-{ev.get('ci_high', 0):.1%})"))
    if lin.get("offline_eval"):
        rows.insert(2, ("offline", f"normalised chunk MSE {lin['offline_eval']['mse_norm']:.4f}"))
    md = f"### Promotion of `{name}` v{v}\n\n| | |\n|---|---|\n" + "\n".join(f"| {k} | {val} |" for k, val in rows)
    create_markdown_artifact(md, key=artifact_key("promotion", name), description=f"{name} v{v} promoted")
    return md
