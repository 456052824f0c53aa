"""What roboloop's plots share: a headless figure, success rates with their intervals, an atomic PNG write."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from roboloop import fsutil


def subplots(*args: Any, **kw: Any) -> tuple[Any, Any]:
    """matplotlib's `subplots` on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kw)


def success_curve(ax: Any, x: Sequence[float], rates: Sequence[float], lows: Sequence[float],
                  highs: Sequence[float]) -> None:
    """Success rates with their 95% intervals as error bars (0 to 1)."""
    err = [[max(0.0, r - lo) for r, lo in zip(rates, lows, strict=True)],
           [max(0.0, hi - r) for r, hi in zip(rates, highs, strict=True)]]
    ax.errorbar(list(x), list(rates), yerr=err, fmt="o-", capsize=4)
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("success rate (95% CI)")


def save(fig: Any, png: Path, dpi: int = 100) -> Path:
    """Lay out, write to a temporary sibling, rename into place, close the figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = fsutil.temp_sibling(png)
    try:
        fig.savefig(tmp, dpi=dpi, format="png")
        tmp.replace(png)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return png
