"""Checkpoint sweeps: every kept checkpoint of a training run as a model folder, scored, the best chosen.

The final loss is a poor guide to closed-loop success (flow-matching loss keeps falling while
success plateaus or drops), so platforms score checkpoints in simulation. A checkpoint becomes
a model folder (`model.safetensors` from its weights, the run's `config.json` and `stats.json`,
`checkpoint_step` recorded) beside the run, never inside it; the run's own files are only read.

Teams with only a real robot must pick checkpoints without a simulator. So where both exist, each checkpoint
is also scored offline (its action-chunk error on the episodes the run held out, as `evaluate --offline` scores
real recordings) and beside its training loss, and `rank_agreement` says how well each of those ranks the
checkpoints as the simulator does (Spearman's rho with a 95% interval) and which checkpoint it would have picked.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

# offline scores of a checkpoint, lower is better: held-out chunk MSE and MAE (/ the action std), training loss
OFFLINE_SCORES = ("offline_mse_norm", "offline_mae_norm", "train_loss")


@dataclass
class Scored:
    step: int
    model: str
    success_rate: float
    ci_low: float
    ci_high: float
    successes: int
    episodes: int
    offline: dict[str, float] = field(default_factory=dict)  # OFFLINE_SCORES it has


def best(scored: list[Scored]) -> Scored:
    """Highest success; ties go to the higher Wilson lower bound, then to the later step."""
    return max(scored, key=lambda s: (s.success_rate, s.ci_low, s.step))


def plot_sweep(scored: list[Scored], png: Path, title: str = "") -> Path:
    from roboloop import plots

    fig, ax = plots.subplots(figsize=(5.5, 3.2))
    plots.success_curve(ax, [s.step for s in scored], [s.success_rate for s in scored], [s.ci_low for s in scored],
                        [s.ci_high for s in scored])
    b = best(scored)
    ax.plot([b.step], [b.success_rate], "r*", ms=14, label=f"best: step {b.step}")
    ax.set_xlabel("training step")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right", fontsize=8)  # not 'best': its search warns when slow, as on a busy machine
    return plots.save(fig, png)


def train_loss_at(run: str | Path, step: int, window: int = 20) -> float | None:
    """The run's mean logged loss over the `window` steps up to `step` (metrics.jsonl); None if none logged."""
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    losses = [float(r["loss"]) for r in rows if "loss" in r and step - window < int(r.get("step", -1)) <= step]
    return sum(losses) / len(losses) if losses else None


def spearman(x: list[float], y: list[float]) -> tuple[float, float | None, float | None]:
    """Spearman's rho (ties ranked by their mean) with a 95% interval from Fisher's z and the variance
    1.06 / (n - 3) (Fieller, Hartley & Pearson 1957); no interval below 4 points, nan when either is constant."""
    from scipy.stats import rankdata

    n = len(x)
    if n < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return math.nan, None, None
    rx, ry = rankdata(x), rankdata(y)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    rho = float(cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)))
    if n < 4 or abs(rho) > 1 - 1e-9:  # Fisher's z has no interval at |rho| = 1: see `permutation_p`
        return rho, None, None
    z, half = math.atanh(rho), 1.96 * math.sqrt(1.06 / (n - 3))
    return rho, math.tanh(z - half), math.tanh(z + half)


def permutation_p(x: list[float], y: list[float], draws: int = 20000) -> float | None:
    """One-sided p-value of Spearman's rho: the share of orderings of `y` whose rho with `x` is at least the
    observed one (every ordering up to 8 points, else `draws` seeded random ones); None when rho is undefined."""
    import itertools
    import random

    rho = spearman(x, y)[0]
    if math.isnan(rho):
        return None
    if len(y) <= 8:
        perms: list = list(itertools.permutations(y))
    else:
        rng = random.Random(0)
        perms = [rng.sample(y, len(y)) for _ in range(draws)]
    hits = sum(1 for p in perms if spearman(x, list(p))[0] >= rho - 1e-12)
    return hits / len(perms)


def rank_agreement(scored: list[Scored]) -> dict:
    """For each offline score the checkpoints have: Spearman's rho between (minus) the score and the simulator's
    success (1: it orders the checkpoints as the simulator does), its 95% interval and its permutation p-value
    (how often a random ordering agrees as well: with 6 checkpoints a perfect ranking has p = 1/720), the
    checkpoint it would pick
    (lowest score) and that checkpoint's success short of the best one's (regret)."""
    top = best(scored)
    out: dict = {"checkpoints": len(scored), "best_step": top.step, "best_success_rate": top.success_rate,
                 "scores": {}}
    if len({s.success_rate for s in scored}) < 2:
        out["note"] = "every checkpoint had the same success: nothing to rank"
    for name in OFFLINE_SCORES:
        have = [s for s in scored if name in s.offline and math.isfinite(s.offline[name])]
        if len(have) < len(scored) or len(have) < 2:
            continue
        rho, lo, hi = spearman([-s.offline[name] for s in have], [s.success_rate for s in have])
        pick = min(have, key=lambda s: (s.offline[name], -s.step))
        p = permutation_p([-s.offline[name] for s in have], [s.success_rate for s in have])
        out["scores"][name] = {"spearman": None if math.isnan(rho) else round(rho, 3),
                               "ci": None if lo is None or hi is None else [round(lo, 3), round(hi, 3)],
                               "p": None if p is None else round(p, 4),
                               "picks_step": pick.step, "picked_success_rate": pick.success_rate,
                               "regret": round(top.success_rate - pick.success_rate, 4)}
    return out


def offline_scores(run: str | Path, step: int, model, cache=None) -> dict[str, float]:
    """A checkpoint's OFFLINE_SCORES: its training loss at `step`, and where the run held out episodes
    (`val_fraction` > 0) and its dataset is here, its chunk errors on them (`stages.evaluate_offline`, cached)."""
    from roboloop import stages
    from roboloop.evaluation.config import OfflineRecipe
    from roboloop.policies import model_info

    out: dict[str, float] = {}
    loss = train_loss_at(run, step)
    if loss is not None:
        out["train_loss"] = loss
    dataset = model.config.get("dataset", "")
    if model_info(model.path).split.get("validation_episodes") and dataset and Path(dataset).is_dir():
        s = stages.evaluate_offline(model, stages.dataset_ref(dataset), OfflineRecipe(plot_episodes=0), cache=cache)
        out["offline_mse_norm"] = s.mse_norm
        out["offline_mae_norm"] = sum(s.mae_norm) / len(s.mae_norm)
    return out
