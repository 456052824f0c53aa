"""mkdocs hook: the Results page's records table, and every page's quoted figures (`{{ BENCH: KEY }}`), rendered
from `bench/results/` when the site is built (so whether a record is stale is decided against the code as it is
now, not when the page was written)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- records -->"


def _record_module():
    spec = importlib.util.spec_from_file_location("bench_record", ROOT / "bench" / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_page_markdown(markdown: str, page, **_) -> str:
    record = _record_module()
    records = record.load()
    if page.file.src_uri == "results.md":
        markdown = markdown.replace(MARKER, record.markdown(records))
    return record.render_quotes(markdown, page.file.src_uri, records)
