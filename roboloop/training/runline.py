"""One line saying what a training run ran (precision, FP8 linears, attention kernel, device), from its run record
(`metrics.jsonl`'s first row, `policy.json`'s `runtime`): for logs, the loop's summary and the UI. Torch-free, so
the summary and the flows can say it without importing the trainer."""

from __future__ import annotations


def run_line(rec: dict) -> str:
    """One line for logs, summaries and the UI: precision and attention as a training run used them."""
    fp8 = f", {rec['fp8_linears']} linears in FP8 ({rec['fp8_backend']})" if rec.get("precision") == "fp8" else ""
    att = f"; attention {rec['attention']} ({rec.get('attention_reason', '')})" if rec.get("attention") else ""
    return f"precision {rec['precision']}{fp8} ({rec['precision_reason']}){att}; device {rec['device']}"
