"""Offline evaluation: how well a model predicts the recorded actions of episodes it never trained on.

For data without a simulator twin (real-robot recordings). At every `stride`-th frame of each
held-out episode the model predicts an action chunk from the recorded observation (state,
camera frames, instruction); the chunk is compared with the recorded actions of the next H
frames (steps past the episode's end are not counted). Errors are reported per action
dimension in physical units (the dataset's) and normalised by the action std the model
was trained with, so dimensions in radians and in metres can be summed. A seeded noise
generator makes two models' predictions comparable frame by frame (`compare`).

Two trivial predictors are scored on the same frames, so a number means something on its own
and a first model has something to beat (the promotion gate uses the better of them):
`mean_action` predicts the training mean action at every step (normalised MSE about 1 by
construction), `previous_action` repeats the action recorded just before the frame (what a
robot holding its last command would do; the mean action at an episode's first frame).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from roboloop import fsutil
from roboloop.datasets.layout import ENV_STATE
from roboloop.policies.obs import Obs


def chunk_errors(pred: np.ndarray, target: np.ndarray, valid: np.ndarray, std: np.ndarray) -> dict[str, np.ndarray]:
    """pred, target (N, H, A); valid (N, H) bool; std (A,). Per dimension over valid steps: MAE and RMSE in
    physical units and normalised (divided by std); per sample: normalised MSE over its valid steps."""
    w = valid[..., None].astype(np.float64)
    err = (pred.astype(np.float64) - target.astype(np.float64)) * w
    n = max(float(w.sum()), 1.0)
    mae = np.abs(err).sum(axis=(0, 1)) / n
    rmse = np.sqrt((err**2).sum(axis=(0, 1)) / n)
    s = np.maximum(std.astype(np.float64), 1e-6)
    per_sample = ((err / s) ** 2).sum(axis=(1, 2)) / np.maximum(w.sum(axis=(1, 2)) * pred.shape[-1], 1.0)
    return {"mae": mae, "rmse": rmse, "mae_norm": mae / s, "rmse_norm": rmse / s, "per_sample_mse_norm": per_sample}


@dataclass
class OfflineReport:
    dataset: str
    policy: str
    episodes: list[int]
    split: str  # "validation" (the model's held-out episodes) or "all"
    samples: int
    stride: int
    action_names: list[str]
    mae: list[float]
    rmse: list[float]
    mae_norm: list[float]
    rmse_norm: list[float]
    mse_norm: float  # mean over samples of the normalised chunk MSE: the one number to compare models by
    first_action_mae: list[float]  # the action executed next, per dimension (physical units)
    plot: str | None = None
    per_episode_mse_norm: dict[int, float] = field(default_factory=dict)
    # trivial predictors on the same frames: {name: {"mse_norm": x, "per_episode": {episode: x}}}
    baselines: dict[str, dict] = field(default_factory=dict)

    def line(self) -> str:
        d = {k: v for k, v in asdict(self).items() if k != "per_episode_mse_norm"}
        d["baselines"] = {k: b["mse_norm"] for k, b in self.baselines.items()}
        return json.dumps(d)


def baseline_predictions(ds, keys: np.ndarray, mean_action: np.ndarray, horizon: int) -> dict[str, np.ndarray]:
    """(N, H, A) chunks of the trivial predictors at frames `keys` (see the module docstring)."""
    n = len(keys)
    mean = np.broadcast_to(mean_action.astype(np.float32), (n, horizon, mean_action.shape[-1]))
    first = ds.frame_index[keys] == 0
    prev = ds.action[np.maximum(keys - 1, 0)].astype(np.float32)
    prev[first] = mean_action
    return {"mean_action": np.ascontiguousarray(mean), "previous_action": np.repeat(prev[:, None], horizon, axis=1)}


def _load(dataset: str | Path, model_dir: str | Path, device: str, seed: int):
    from roboloop.policies import load_policy
    from roboloop.training.data import V3Dataset

    policy = load_policy(model_dir, device=device, seed=seed)
    env_key = ENV_STATE if getattr(policy, "env_state_dim", 0) else None  # a policy that reads the scene's state
    ds = V3Dataset(dataset, horizon=policy.horizon, state_key=policy.state_key, action_key=policy.action_key,
                   env_key=env_key)
    if env_key and ds.env_state is None:
        raise ValueError(f"{dataset}: the model reads {ENV_STATE}, which this dataset does not have: score it on "
                         "the dataset it was trained on")
    return policy, ds


def held_out(model_dir: str | Path, ds_episodes: list[int], episodes: str | list[int]) -> tuple[list[int], str]:
    """The episodes to score: the model's recorded validation split, all, or a given list."""
    if isinstance(episodes, list):
        return sorted(episodes), "given"
    if episodes == "all":
        return sorted(ds_episodes), "all"
    from roboloop.policies import model_info

    val = model_info(model_dir).split.get("validation_episodes") or []
    if not val:
        raise ValueError(f"{model_dir}: the model holds out no episodes (trained with val_fraction 0); train with "
                         "val_fraction > 0, or score --episodes all (which includes its training data)")
    missing = sorted(set(val) - set(ds_episodes))
    if missing:
        raise ValueError(f"{model_dir}: its validation episodes {missing[:5]} are not in this dataset: is it the "
                         "dataset the model was trained on?")
    return sorted(val), "validation"


def predict(policy, ds, episodes: list[int], stride: int = 1, batch: int = 64) -> dict[str, np.ndarray]:
    """Predicted chunks (physical units) and the recorded ones at every `stride`-th frame of `episodes`."""
    keys = [ds.ep_from[e] + f for e in episodes for f in range(0, ds.ep_to[e] - ds.ep_from[e], stride)]
    frames: dict = {}
    vkeys = policy.camera_keys
    missing = [k for k in vkeys if k not in ds.camera_keys]
    if missing:
        raise ValueError(f"{ds.root}: the model sees cameras {missing} this dataset does not have (it has "
                         f"{ds.camera_keys}): score it on the dataset it was trained on")
    history = int(getattr(policy, "history", 1))  # frames a history policy reads (oldest first)

    def obs_at(ks: list[int], back: int) -> Obs:
        """The observations `back` frames before each key (clamped to its episode's first frame)."""
        nonlocal frames
        ks = [max(k - back, ds.ep_from[int(ds.episode_index[k])]) for k in ks]
        images = {}
        for cam in vkeys:
            imgs = []
            for k in ks:
                e = int(ds.episode_index[k])
                if (e, cam) not in frames:
                    n = ds.ep_to[e] - ds.ep_from[e]
                    frames = {kk: v for kk, v in frames.items() if kk[0] == e}  # one episode's frames in memory
                    frames[(e, cam)] = ds.decode_window(e, cam, 0, n, policy.image_size)
                imgs.append(frames[(e, cam)][int(ds.frame_index[k])])
            images[cam] = torch.from_numpy(np.stack(imgs))
        env = None if ds.env_state is None else torch.from_numpy(np.stack([ds.env_state[k] for k in ks]))
        return Obs(torch.from_numpy(np.stack([ds.state[k] for k in ks])), images, [ds.task(k) for k in ks], env)

    preds, targets, valid = [], [], []
    for lo in range(0, len(keys), batch):
        ks = keys[lo:lo + batch]
        obs = obs_at(ks, 0)
        if history > 1:
            obs.past = [obs_at(ks, back) for back in range(history - 1, 0, -1)]
        preds.append(policy.act(obs).numpy())
        chunks = [ds.action_chunk(k) for k in ks]
        targets.append(np.stack([c[0] for c in chunks]))
        valid.append(~np.stack([c[1] for c in chunks]))
    return {"keys": np.asarray(keys), "episode": ds.episode_index[np.asarray(keys)], "pred": np.concatenate(preds),
            "target": np.concatenate(targets), "valid": np.concatenate(valid)}


def evaluate_offline(dataset: str | Path, model_dir: str | Path, episodes: str | list[int] = "validation",
                     stride: int = 1, device: str = "cpu", seed: int = 0, output_dir: str | Path | None = None,
                     plot_episodes: int = 3) -> OfflineReport:
    policy, ds = _load(dataset, model_dir, device, seed)
    eps, split = held_out(model_dir, [e.episode_index for e in ds.meta.episodes], episodes)
    p = predict(policy, ds, eps, stride)
    std = np.asarray(policy.stats[ds.action_key]["std"], dtype=np.float64)
    e = chunk_errors(p["pred"], p["target"], p["valid"], std)
    first = np.abs(p["pred"][:, 0] - p["target"][:, 0]).mean(axis=0)
    names = ds.meta.info.features[ds.action_key].flat_names() or []
    if len(names) != std.shape[0]:
        names = [f"{ds.action_key}[{i}]" for i in range(std.shape[0])]
    per_ep = {int(ep): float(e["per_sample_mse_norm"][p["episode"] == ep].mean()) for ep in eps}
    if not all(math.isfinite(x) for x in [*per_ep.values(), *e["mae"].tolist()]):
        bad = sorted(ep for ep, x in per_ep.items() if not math.isfinite(x))
        raise ValueError(f"{dataset}: the scores of episodes {bad[:5]} are not finite (NaN or inf in the model's "
                         "predictions or in the recorded actions); check the data with roboloop validate")
    baselines = {}
    mean_action = np.asarray(policy.stats[ds.action_key]["mean"], dtype=np.float32)
    for name, pred in baseline_predictions(ds, p["keys"], mean_action, p["pred"].shape[1]).items():
        be = chunk_errors(pred, p["target"], p["valid"], std)["per_sample_mse_norm"]
        baselines[name] = {"mse_norm": float(be.mean()),
                           "per_episode": {int(ep): float(be[p["episode"] == ep].mean()) for ep in eps}}
    report = OfflineReport(dataset=str(Path(dataset).absolute()), policy=str(Path(model_dir).absolute()),
                           episodes=eps, split=split, samples=len(p["keys"]), stride=stride, action_names=names,
                           mae=e["mae"].tolist(), rmse=e["rmse"].tolist(), mae_norm=e["mae_norm"].tolist(),
                           rmse_norm=e["rmse_norm"].tolist(), mse_norm=float(e["per_sample_mse_norm"].mean()),
                           first_action_mae=first.tolist(), per_episode_mse_norm=per_ep, baselines=baselines)
    if output_dir is not None:
        if Path(output_dir).exists():
            raise FileExistsError(f"{output_dir} already exists: offline evaluation writes a new folder; choose "
                                  "another --output-dir")
        Path(output_dir).parent.mkdir(parents=True, exist_ok=True)
        out = fsutil.make_dir(Path(output_dir))
        if plot_episodes > 0:
            report.plot = str(plot_open_loop(p, eps[:plot_episodes], names, out / "open_loop.png"))
        fsutil.atomic_write_text(out / "offline.json", json.dumps(asdict(report), indent=1))
    return report


def plot_open_loop(p: dict, episodes: list[int], names: list[str], png: Path) -> Path:
    """Predicted (first action of each chunk) vs recorded action, per dimension, for a few episodes."""
    from roboloop import plots

    dims = p["pred"].shape[-1]
    fig, axes = plots.subplots(len(episodes), dims, figsize=(2.2 * dims, 1.8 * len(episodes) + 0.6), squeeze=False)
    for r, ep in enumerate(episodes):
        m = p["episode"] == ep
        for d in range(dims):
            ax = axes[r][d]
            ax.plot(p["target"][m, 0, d], color="k", lw=1, label="recorded")
            ax.plot(p["pred"][m, 0, d], color="tab:orange", lw=1, label="predicted")
            if r == 0:
                ax.set_title(names[d] if d < len(names) else f"a{d}", fontsize=8)
            if d == 0:
                ax.set_ylabel(f"ep {ep}", fontsize=8)
            ax.tick_params(labelsize=6)
    axes[0][0].legend(loc="upper right", fontsize=6)  # not 'best': its search warns when slow
    fig.suptitle("open loop: predicted vs recorded actions (held-out episodes)", fontsize=9)
    return plots.save(fig, png, dpi=90)


@dataclass
class OfflineComparison:
    challenger: str
    champion: str
    episodes: int
    challenger_mse_norm: float
    champion_mse_norm: float
    diff: float  # challenger - champion (lower is better), mean over episodes
    ci_low: float
    ci_high: float
    not_worse: bool  # ci_high < margin * champion error

    def line(self) -> str:
        return json.dumps(asdict(self))


def compare(dataset: str | Path, challenger: str | Path, champion: str | Path, episodes: str | list[int] = "validation",
            stride: int = 1, margin: float = 0.05, seed: int = 0, device: str = "cpu") -> OfflineComparison:
    """Paired over the same frames (and the same flow-matching noise): the per-episode difference of the
    normalised chunk MSE, with a t interval over episodes (frames of an episode are not independent).
    Non-inferior when the upper bound is below `margin` times the champion's error."""
    from scipy import stats as sps

    a = evaluate_offline(dataset, challenger, episodes, stride, device, seed)
    b = evaluate_offline(dataset, champion, a.episodes, stride, device, seed)
    d = np.asarray([a.per_episode_mse_norm[e] - b.per_episode_mse_norm[e] for e in a.episodes])
    mean = float(d.mean())
    half = float(sps.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.inf
    return OfflineComparison(str(challenger), str(champion), len(d), a.mse_norm, b.mse_norm, mean, mean - half,
                             mean + half, mean + half < margin * b.mse_norm)
