"""Feature statistics in LeRobot's format, with quantiles.

Per-episode stats are {feature: {min, max, mean, std, count, q01..q99}}; vectors have shape
(D,), images (C, 1, 1) in [0, 1]. Dataset stats aggregate episodes exactly for min, max,
mean and std (parallel variance, as LeRobot does). Quantiles cannot be aggregated from
per-episode quantiles without error, so dataset quantiles come from a streaming histogram
over every row (`QuantileSketch`), bounded in memory whatever the dataset size, with an
error of at most (max - min) / num_bins per dimension.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
QUANTILE_KEYS = tuple(f"q{int(round(q * 100)):02d}" for q in QUANTILES)

FeatureStats = dict[str, np.ndarray]


def vector_stats(values: np.ndarray, with_quantiles: bool = True) -> FeatureStats:
    """Stats of an (N, D) or (N,) array over axis 0; shapes (D,) or (1,)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    arr = arr.reshape(arr.shape[0], -1)
    out: FeatureStats = {
        "min": arr.min(axis=0),
        "max": arr.max(axis=0),
        "mean": arr.mean(axis=0),
        "std": arr.std(axis=0),
        "count": np.array([arr.shape[0]]),
    }
    if with_quantiles:
        qs = np.quantile(arr, QUANTILES, axis=0)
        out.update({k: qs[i] for i, k in enumerate(QUANTILE_KEYS)})
    return out


def image_stats(frames_NHWC: np.ndarray, with_quantiles: bool = False) -> FeatureStats:
    """Per-channel stats of uint8 frames, scaled to [0, 1], shaped (C, 1, 1) like LeRobot's."""
    n, _, _, c = frames_NHWC.shape
    flat = frames_NHWC.reshape(-1, c).astype(np.float64) / 255.0
    st = vector_stats(flat, with_quantiles)
    st = {k: (v if k == "count" else v.reshape(c, 1, 1)) for k, v in st.items()}
    st["count"] = np.array([n])
    return st


def sample_indices(length: int) -> list[int]:
    """Which frames of an episode image stats look at (LeRobot's sampling rule)."""
    min_samples, max_samples, power = 100, 10_000, 0.75
    num = length if length < min_samples else max(min_samples, min(int(length**power), max_samples))
    return np.round(np.linspace(0, length - 1, num)).astype(int).tolist()


def aggregate(episode_stats: Sequence[dict[str, FeatureStats]]) -> dict[str, FeatureStats]:
    """Combine per-episode stats the way LeRobot's `aggregate_stats` does (count-weighted)."""
    keys = sorted({k for s in episode_stats for k in s})
    out: dict[str, FeatureStats] = {}
    for key in keys:
        parts = [s[key] for s in episode_stats if key in s]
        means = np.stack([p["mean"] for p in parts])
        variances = np.stack([p["std"] ** 2 for p in parts])
        counts = np.stack([p["count"] for p in parts]).astype(np.float64)
        total = counts.sum(axis=0)
        while counts.ndim < means.ndim:
            counts = counts[..., None]
        mean = (means * counts).sum(axis=0) / total
        var = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
        agg: FeatureStats = {
            "min": np.min(np.stack([p["min"] for p in parts]), axis=0),
            "max": np.max(np.stack([p["max"] for p in parts]), axis=0),
            "mean": mean,
            "std": np.sqrt(var),
            "count": total.astype(np.int64),
        }
        for q in QUANTILE_KEYS:
            if all(q in p for p in parts):
                agg[q] = (np.stack([p[q] for p in parts]) * counts).sum(axis=0) / total
        out[key] = agg
    return out


class QuantileSketch:
    """Streaming per-dimension histogram between known bounds; memory O(D * num_bins)."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, num_bins: int = 5000):
        self.lo = np.asarray(lo, dtype=np.float64).reshape(-1)
        self.hi = np.asarray(hi, dtype=np.float64).reshape(-1)
        span = np.maximum(self.hi - self.lo, 1e-12)
        self.hi = self.lo + span
        self.num_bins = num_bins
        self.counts = np.zeros((self.lo.size, num_bins), dtype=np.int64)

    def update(self, values: np.ndarray) -> None:
        arr = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
        if arr.shape[1] != self.lo.size:
            raise ValueError(f"expected {self.lo.size} dims, got {arr.shape[1]}")
        pos = (arr - self.lo) / (self.hi - self.lo) * self.num_bins
        idx = np.clip(pos.astype(np.int64), 0, self.num_bins - 1)
        for d in range(arr.shape[1]):
            self.counts[d] += np.bincount(idx[:, d], minlength=self.num_bins)

    def quantiles(self) -> dict[str, np.ndarray]:
        cum = np.cumsum(self.counts, axis=1)
        total = cum[:, -1:]
        width = (self.hi - self.lo) / self.num_bins
        out = {}
        for q, key in zip(QUANTILES, QUANTILE_KEYS, strict=True):
            target = q * total[:, 0]
            b = np.array([np.searchsorted(cum[d], target[d]) for d in range(cum.shape[0])])
            b = np.clip(b, 0, self.num_bins - 1)
            before = np.where(b > 0, cum[np.arange(cum.shape[0]), b - 1], 0)
            inbin = np.maximum(self.counts[np.arange(cum.shape[0]), b], 1)
            frac = np.clip((target - before) / inbin, 0.0, 1.0)
            out[key] = self.lo + (b + frac) * width
        return out


def to_jsonable(stats: dict[str, FeatureStats]) -> dict:
    return {k: {s: np.asarray(v).tolist() for s, v in fs.items()} for k, fs in stats.items()}
