"""metrics.jsonl, read in one place: the per-step rows a training run writes, and their summary."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def read_rows(out: str | Path) -> list[dict[str, Any]]:
    path = Path(out) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill: the rows before it stand
    return rows


def summary(out: str | Path) -> dict[str, Any]:
    """first/final loss, steps, throughput and efficiency of the run in `out` (NaN-free, JSON-safe)."""
    rows = read_rows(out)
    if not rows:
        return {}
    last = rows[-1]
    tail = rows[-20:]

    def finite(x: Any) -> Any:
        return x if not isinstance(x, float) or math.isfinite(x) else None

    ran = next((r["run"] for r in reversed(rows) if "run" in r), None)  # the last (re)start's record
    # wall clock: each (re)start's last elapsed_s (its rows count from that process's start), summed
    starts = [i for i, r in enumerate(rows) if "run" in r] or [0]
    ends = [*starts[1:], len(rows)]
    elapsed = [rows[e - 1].get("elapsed_s") for e in ends]
    wall = {"train_s": round(sum(float(x) for x in elapsed if x is not None), 1)} if None not in elapsed else {}
    return {"steps": last["step"], **wall, "first_loss": finite(rows[0]["loss"]), "final_loss": finite(last["loss"]),
            "samples_per_s": round(sum(r["samples_per_s"] for r in tail) / len(tail), 1),
            "data_wait_fraction": round(last.get("data_wait_fraction", 0.0), 3), "mfu": last.get("mfu"),
            **({"run": {k: v for k, v in ran.items() if k != "fp8_linear_names"}} if ran else {})}


def plot_loss(metrics_file: Path, png: Path) -> None:
    """The run's training loss by step (log scale): the model folder's loss.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(metrics_file.parent)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows])
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
