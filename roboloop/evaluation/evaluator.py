"""Run exactly N episodes over vectorised, auto-resetting envs and report success with a CI.

Counting without bias: an episode is *counted* iff it was among the first N to start; the
run ends when all N counted episodes have finished. (Stopping at the first N to *finish*
would favour short episodes, which for most tasks are the successful ones.)

Action chunking: the policy returns (n, H, A) chunks; each env executes the first
`execute_steps` actions of its chunk, then re-plans; an env that auto-reset re-plans at
once. Policy calls are batched over the envs that need a new chunk.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from roboloop.evaluation.protocol import BatchedEnv, Obs
from roboloop.evaluation.stats import wilson
from roboloop.lineage import package_versions


class Policy(Protocol):
    name: str

    def act(self, obs: Obs) -> torch.Tensor: ...  # (n, H, A) or (n, A)


@dataclass
class Episode:
    env: int
    success: bool
    ret: float
    length: int


@dataclass
class EvalReport:
    task: str
    policy: str
    backend: str
    episodes: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    mean_return: float
    mean_length: float
    env_steps_per_s: float
    policy_steps_per_s: float
    wall_s: float
    num_envs: int
    versions: dict[str, str] = field(default_factory=dict)
    asset_hashes: dict[str, str] = field(default_factory=dict)
    videos: list[str] = field(default_factory=list)
    plot: str | None = None
    rollouts: str | None = None
    per_episode: list[dict] = field(default_factory=list)

    def to_json(self, full: bool = False) -> str:
        d = asdict(self)
        if not full:
            d.pop("per_episode")
        return json.dumps(d)


class Recorder:
    """Keeps per-env trajectories of counted episodes (for videos and rollout datasets)."""

    def __init__(self, num_envs: int, keep_frames: bool):
        self.keep_frames = keep_frames
        self.cur: list[dict] = [self._empty() for _ in range(num_envs)]

    @staticmethod
    def _empty() -> dict:
        return {"states": [], "actions": [], "images": {}, "task": ""}

    def record(self, i: int, obs: Obs, action: torch.Tensor) -> None:
        c = self.cur[i]
        c["states"].append(obs.state[i].cpu().numpy())
        c["actions"].append(action[i].cpu().numpy())
        c["task"] = obs.instructions[i] if obs.instructions else ""
        if self.keep_frames:
            for k, v in obs.images.items():
                c["images"].setdefault(k, []).append(v[i].cpu().numpy())

    def pop(self, i: int) -> dict:
        done, self.cur[i] = self.cur[i], self._empty()
        return done


def evaluate(env: BatchedEnv, policy: Policy, episodes: int, execute_steps: int = 8, videos: int = 2,
             output_dir: str | Path | None = None, record_rollouts: bool = False, seed: int = 0,
             max_env_steps: int = 10_000_000) -> tuple[EvalReport, list[dict]]:
    """Returns the report and (if `record_rollouts`) the counted episodes' trajectories."""
    if episodes < 1:
        raise ValueError("episodes must be >= 1")
    n = env.num_envs
    out = Path(output_dir) if output_dir else None
    obs = env.reset(seed=seed)
    counted = torch.arange(n) < episodes
    started = int(counted.sum())
    chunk: torch.Tensor | None = None
    idx = torch.full((n,), execute_steps, dtype=torch.long)  # >= execute_steps: needs a plan
    ret, length = torch.zeros(n), torch.zeros(n, dtype=torch.long)
    results: list[Episode] = []
    trajectories: list[dict] = []
    want_frames = record_rollouts or (videos > 0 and out is not None)
    rec = Recorder(n, keep_frames=want_frames) if (record_rollouts or videos) else None
    video_eps: list[dict] = []
    t0, env_steps, policy_rows, policy_s = time.perf_counter(), 0, 0, 0.0
    while len(results) < episodes:
        need = idx >= execute_steps
        if need.any():
            tp = time.perf_counter()
            new = policy.act(obs.select(need)).detach().float().cpu()
            policy_s += time.perf_counter() - tp
            policy_rows += int(need.sum())
            if new.ndim == 2:
                new = new[:, None]
            if chunk is None or chunk.shape[1] != new.shape[1]:
                chunk = torch.zeros(n, new.shape[1], new.shape[2])
            chunk[need] = new
            idx[need] = 0
        assert chunk is not None
        steps_avail = min(execute_steps, chunk.shape[1])
        action = chunk[torch.arange(n), idx.clamp(max=chunk.shape[1] - 1)]
        action = torch.maximum(torch.minimum(action, env.action_high), env.action_low)
        if rec is not None:
            for i in counted.nonzero().flatten().tolist():
                rec.record(i, obs, action)
        res = env.step(action)
        env_steps += n
        idx += 1
        idx[idx >= steps_avail] = execute_steps
        ret += res.reward.float().cpu()
        length += 1
        for i in res.done.nonzero().flatten().tolist():
            if counted[i]:
                results.append(Episode(i, bool(res.success[i]), float(ret[i]), int(length[i])))
                if rec is not None:
                    traj = rec.pop(i)
                    traj["success"] = bool(res.success[i])
                    if record_rollouts:
                        trajectories.append(traj)
                    if len(video_eps) < videos and traj["images"]:
                        video_eps.append(traj)
            elif rec is not None:
                rec.pop(i)
            counted[i] = started < episodes
            started += int(counted[i])
            ret[i], length[i] = 0.0, 0
            idx[i] = execute_steps  # re-plan from the new episode's first observation
        obs = res.obs
        if env_steps > max_env_steps:
            raise RuntimeError(f"{len(results)}/{episodes} episodes after {env_steps} env steps: an env never ends")
    wall = time.perf_counter() - t0
    succ = sum(e.success for e in results)
    lo, hi = wilson(succ, episodes)
    report = EvalReport(
        task=env.task, policy=policy.name, backend=env.backend, episodes=episodes, successes=succ,
        success_rate=succ / episodes, ci_low=lo, ci_high=hi,
        mean_return=float(np.mean([e.ret for e in results])), mean_length=float(np.mean([e.length for e in results])),
        env_steps_per_s=env_steps / wall, policy_steps_per_s=policy_rows / policy_s if policy_s > 0 else 0.0,
        wall_s=wall, num_envs=n, versions=package_versions(), per_episode=[asdict(e) for e in results])
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        report.videos = write_videos(video_eps, out, env.fps)
        report.plot = str(plot_report(report, out / "eval.png"))
        (out / "report.json").write_text(report.to_json(full=True))
    return report, trajectories


def write_videos(episodes: list[dict], out: Path, fps: int) -> list[str]:
    from roboloop.datasets.video import encode_frames

    paths = []
    for j, ep in enumerate(episodes):
        for cam, frames in ep["images"].items():
            tag = "success" if ep["success"] else "failure"
            p = out / "videos" / f"rollout{j:02d}_{cam.replace('.', '_')}_{tag}.mp4"
            p.parent.mkdir(parents=True, exist_ok=True)
            arr = np.stack(frames)
            h, w = arr.shape[1] - arr.shape[1] % 2, arr.shape[2] - arr.shape[2] % 2  # yuv420p needs even sizes
            encode_frames(arr[:, :h, :w], p, fps)
            paths.append(str(p))
    return paths


def plot_report(report: EvalReport, png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = report.per_episode
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    succ = np.cumsum([e["success"] for e in eps]) / np.arange(1, len(eps) + 1)
    a.plot(np.arange(1, len(eps) + 1), succ)
    a.axhspan(report.ci_low, report.ci_high, alpha=0.2, label="Wilson 95% CI")
    a.set_ylim(-0.02, 1.02)
    a.set_xlabel("episodes finished")
    a.set_ylabel("success rate")
    a.legend(loc="lower right")
    lengths = [[e["length"] for e in eps if e["success"]], [e["length"] for e in eps if not e["success"]]]
    b.hist(lengths, bins=20, stacked=True, label=["success", "failure"])
    b.set_xlabel("episode length (steps)")
    b.legend()
    fig.suptitle(f"{report.task} - {report.policy}: {report.success_rate:.2f} "
                 f"[{report.ci_low:.2f}, {report.ci_high:.2f}]")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
