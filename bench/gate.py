"""The promotion gate's error rates, by simulation (`roboloop/registry/simulate.py`): how often a challenger that is
in truth `margin` worse than the champion is promoted (what alpha promises to bound), and how often an equally good
one is (the gate's power), with and without the early stop.

    python bench/gate.py [--runs 2000] [--episodes 96] [--margin 0.05] [--alpha 0.05]

Each row is one champion success rate p and one correlation rho (the chance an episode's two outcomes share their
draw: paired initial states are easy or hard for both). Columns: promoted at delta = margin with the early stop,
without it, and with the early stop as the gate tested a run's end before (at the full alpha); promoted at
delta = 0 and the episodes played. Seeded: the same figures on any machine. Baseline: alpha itself (a rate at
delta = margin above it is a gate that promotes worse challengers more often than it says). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/gate.py", "roboloop/registry/simulate.py", "roboloop/registry/__init__.py", "roboloop/binomial.py"]
SETTINGS = [(0.5, 0.0), (0.8, 0.0), (0.8, 0.7), (0.95, 0.7)]


def row(p: float, rho: float, args: argparse.Namespace) -> dict:
    from roboloop.registry.simulate import promotion_rate

    kw = dict(planned=args.episodes, margin=args.margin, alpha=args.alpha, runs=args.runs)
    early = promotion_rate(p, args.margin, rho, **kw)
    equal = promotion_rate(p, 0.0, rho, **kw)
    return {"p": p, "rho": rho, "worse_promoted_early_stop": early.promoted,
            "worse_promoted_no_early_stop": promotion_rate(p, args.margin, rho, early_stop=False, **kw).promoted,
            "worse_promoted_full_alpha_end": promotion_rate(p, args.margin, rho, final_alpha_per_look=False,
                                                            **kw).promoted,
            "equal_promoted": equal.promoted, "equal_mean_episodes": equal.mean_episodes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000, help="simulated evaluations per cell")
    ap.add_argument("--episodes", type=int, default=96)
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--alpha", type=float, default=0.05)
    args = ap.parse_args()
    rows = [row(p, rho, args) for p, rho in SETTINGS]
    emit({"runs": args.runs, "episodes": args.episodes, "margin": args.margin, "alpha": args.alpha,
          "baseline": "alpha: the false-promotion rate the gate promises at delta = margin",
          "rows": {f"p{round(p * 100)}_rho{round(rho * 100)}": r for (p, rho), r in zip(SETTINGS, rows, strict=True)},
          "worst_worse_promoted_early_stop": max(r["worse_promoted_early_stop"] for r in rows)}, MEASURES)


if __name__ == "__main__":
    main()
