"""Run exactly N episodes over vectorised, auto-resetting envs and report success with a CI.

Counting without bias: an episode is *counted* iff it was among the first N to start; the
run ends when all N counted episodes have finished. (Stopping at the first N to *finish*
would favour short episodes, which for most tasks are the successful ones.)

Action chunking: the policy returns (n, H, A) chunks; each env executes the first
`execute_steps` actions of its chunk, then re-plans; an env that auto-reset re-plans at
once. Policy calls are batched over the envs that need a new chunk.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from roboloop.availability import package_versions
from roboloop.binomial import wilson
from roboloop.evaluation import videos as clips
from roboloop.sim.protocol import BatchedEnv, Obs


class Policy(Protocol):
    name: str

    def act(self, obs: Obs) -> torch.Tensor: ...  # (n, H, A) or (n, A)


@dataclass
class Episode:
    env: int
    success: bool
    ret: float
    length: int
    index: int = -1  # the episode's number in start order: the same initial state across runs of the same seed


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
    seed: int = 0  # with the task: which initial states the numbered episodes had
    planned_episodes: int | None = None  # when it stopped early: how many it would have run
    stopped_early: str | None = None  # why (the paired decision that was already certain)
    looks: int | None = None  # run with the early stop: the paired tests it planned (the gate's final one included)
    served: dict | None = None  # through a policy server: its URL, the versions that answered, latencies
    precision: str = "fp32"  # what the model's forward passes ran in (e.g. "bf16 (AVX512-BF16)")
    plan_ms: dict[str, float] = field(default_factory=dict)  # the policy's chunk calls here: p50, p99 (ms)
    # --perturb: factor -> level -> {success_rate, ci_low, ci_high, episodes, drop, lost, gained} (same episodes)
    perturbations: dict | None = None
    perturbation_worst: str | None = None  # factor=level with the largest drop
    # --envelope robot: what the robot's envelope did to the policy's actions (refused chunks held, clamped targets)
    envelope: dict | None = None
    perturbation_videos: list[str] = field(default_factory=list)  # rollouts under the worst one
    perturbation_plot: str | None = None
    contact_sheet: str | None = None  # contact.png: a row of frames per rollout video, captioned
    initial_states: str | None = None  # each counted episode's initial state (`initial_digest`), in episode order
    initial_states_sha256: str | None = None  # of `initial_states`: one name for the whole set
    latency: list[dict] | None = None  # --latency: per setting {setting, ms, delay_steps, success_rate, ..., drop}

    def to_json(self, full: bool = False) -> str:
        d = asdict(self)
        if not full:
            d.pop("per_episode")
        return json.dumps(d)


LOOK_EVERY = 16  # episodes between two looks of an early-stopping evaluation


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
        if obs.env_state is not None:
            c.setdefault("env_state", []).append(obs.env_state[i].cpu().numpy())
        if self.keep_frames:
            for k, v in obs.images.items():
                c["images"].setdefault(k, []).append(v[i].cpu().numpy())

    def pop(self, i: int) -> dict:
        done, self.cur[i] = self.cur[i], self._empty()
        return done


def _refuse(episodes: int, stop_and_record: bool, prefetch: int, execute_steps: int) -> None:
    """What `evaluate` cannot do, refused before it starts."""
    if episodes < 1:
        raise ValueError("episodes must be >= 1")
    if stop_and_record:
        raise ValueError("early stopping and recorded rollouts do not mix (the rollouts would include episodes "
                         "past the stopping point)")
    if not 0 <= prefetch < execute_steps:
        raise ValueError(f"prefetch {prefetch}: ask for the next chunk with 0 to {execute_steps - 1} actions left "
                         f"(of the {execute_steps} executed)")


def evaluate(env: BatchedEnv, policy: Policy, episodes: int, execute_steps: int = 8, videos: int = 2,
             output_dir: str | Path | None = None, record_rollouts: bool = False, seed: int = 0,
             max_env_steps: int = 10_000_000, labeler: Policy | None = None,
             stop: Callable[[list[bool]], str | None] | None = None, look_every: int = LOOK_EVERY,
             progress: Callable[[int, int, int], None] | None = None,
             delay_steps: int = 0, label: str = "policy", prefetch: int = 0,
             envelope: Any = None) -> tuple[EvalReport, list[dict]]:
    """Returns the report and (if `record_rollouts`) the counted episodes' trajectories.

    With a `labeler` (the scripted expert), recorded trajectories carry the labeler's action at each
    visited state instead of the executed one: DART-style noisy demonstrations and DAgger relabelling.

    With `stop`, every `look_every` episodes the outcomes of episodes 0..k-1 (all finished: a prefix by
    start order, so quick episodes are not favoured) are passed to it; a reason returned ends the run
    there, and the report counts exactly those k episodes. `progress(finished, successes, episodes)` is
    called each time a counted episode ends.

    With `delay_steps` (latency charged in simulated time), a chunk asked for at step t arrives at step t + d: the
    simulator goes on meanwhile with the previous chunk's later actions (the arm holds, `env.hold_action(obs)`, where
    none are left or at an episode's start), and the new chunk is executed from its action d on (the ones planned
    for the steps that passed are stale), `execute_steps` actions, as a robot loop without prefetch would. With
    `prefetch` (`roboloop robot --prefetch`), the next chunk is asked for when that many actions of the executing one
    are left, from that step's observation, while they go on.

    With `envelope` (`--envelope robot`), actions pass the robot's envelope as `roboloop robot` applies it
    (`_Run.enveloped`); the report's `envelope` counts what a robot would refuse or clamp.
    With `output_dir`: `videos` rollouts (one of them a failure whenever any episode failed), captioned with `label`
    (the model and version), and a contact sheet (contact.png): `roboloop.evaluation.videos`."""
    _refuse(episodes, stop is not None and record_rollouts, prefetch, execute_steps)
    run = _Run(env, policy, episodes, execute_steps, videos, output_dir is not None, record_rollouts)
    run.labeler, run.progress, run.delay, run.prefetch, run.envelope = labeler, progress, max(0, delay_steps), \
        prefetch, envelope
    obs = env.reset(seed=seed)
    next_look, why = look_every, None
    while len(run.results) < episodes:
        obs = run.step(obs)
        if run.env_steps > max_env_steps:
            raise RuntimeError(f"{len(run.results)}/{episodes} episodes after {run.env_steps} env steps: an env "
                               "never ends")
        if stop is not None and next_look <= len(run.results) < episodes and \
                (k := run.finished_prefix()) >= next_look:
            k = k // look_every * look_every
            next_look = k + look_every
            if why := stop(run.outcomes(k)):
                run.truncate(k)
                break
    report = run.report()
    report.seed = seed
    if why:
        report.planned_episodes, report.stopped_early = episodes, why
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        shown = clips.pick(run.video_eps, run.first_failure)
        report.videos = clips.write_videos(shown, out, env.fps, label)
        sheet = clips.contact_sheet(shown, out / "contact.png", label)
        report.contact_sheet = str(sheet) if sheet else None
        report.plot = str(plot_report(report, out / "eval.png"))
        (out / "report.json").write_text(report.to_json(full=True))
    return report, run.trajectories


class _Run:
    """One evaluation in named steps: re-plan the envs whose chunk is used up, act, count finished episodes.

    Exactly the first `episodes` episodes to *start* are counted (short episodes are not favoured);
    each env executes `execute_steps` actions of its predicted chunk before it re-plans.
    """

    def __init__(self, env: BatchedEnv, policy: Policy, episodes: int, execute_steps: int, videos: int,
                 to_disk: bool, record_rollouts: bool):
        self.env, self.policy, self.episodes = env, policy, episodes
        self.execute_steps, self.videos, self.record_rollouts = execute_steps, videos, record_rollouts
        n = self.n = env.num_envs
        self.counted = torch.arange(n) < episodes
        self.started = int(self.counted.sum())
        self.number = torch.arange(n)  # start-order number of each env's current episode
        self.chunk: torch.Tensor | None = None
        self.idx = torch.full((n,), execute_steps, dtype=torch.long)  # >= end: needs a plan
        self.end = torch.full((n,), execute_steps, dtype=torch.long)  # the chunk index at which an env re-plans
        self.delay = 0  # steps a chunk takes to arrive (latency charged in simulated time)
        self.prefetch = 0  # ask for the next chunk when this many of the executing one's actions are left
        self.pending: torch.Tensor | None = None  # chunks on their way, per env
        self.wait = torch.zeros(n, dtype=torch.long)  # steps until an env's pending chunk arrives (0: none)
        self.fresh_plan = torch.ones(n, dtype=torch.bool)  # no chunk of this episode has arrived yet: hold
        self.ret, self.length = torch.zeros(n), torch.zeros(n, dtype=torch.long)
        self.results: list[Episode] = []
        self.trajectories: list[dict] = []
        want_frames = record_rollouts or (videos > 0 and to_disk)
        self.rec = Recorder(n, keep_frames=want_frames) if (record_rollouts or videos) else None
        self.video_eps: list[dict] = []
        self.first_failure: dict | None = None  # kept while every video episode succeeded
        self.initial: dict[int, str] = {}  # episode number -> its initial state's digest
        self.t0, self.env_steps, self.policy_rows, self.policy_s = time.perf_counter(), 0, 0, 0.0
        self.call_ms: list[float] = []
        self.labeler: Policy | None = None
        self.past: list[Obs] | None = None  # previous frames, for policies that read several (oldest first)
        self.fresh = torch.zeros(n, dtype=torch.bool)  # envs whose episode starts at the next observation
        self.progress: Callable[[int, int, int], None] | None = None
        self.successes = 0
        self.envelope: Any = None
        self.sent: list[torch.Tensor] = []  # the last two actions each env executed (the envelope's step, acceleration)
        self.refused = self.clamped = 0

    def plan(self, obs: Obs) -> None:
        need = (self.idx >= self.end - self.prefetch) & (self.wait == 0)
        if not need.any():
            return
        tp = time.perf_counter()
        if getattr(self.policy, "whole_batch", False):
            new = self.policy.act(obs).detach().float().cpu()[need]
        else:
            new = self.policy.act(obs.select(need)).detach().float().cpu()
        self.policy_s += time.perf_counter() - tp
        self.call_ms.append((time.perf_counter() - tp) * 1e3)
        self.policy_rows += int(need.sum())
        if new.ndim == 2:
            new = new[:, None]
        if self.chunk is None or self.chunk.shape[1] != new.shape[1]:
            self.chunk = torch.zeros(self.n, new.shape[1], new.shape[2])
            self.pending = torch.zeros_like(self.chunk)
        if self.delay == 0:
            self.chunk[need] = new
            self.idx[need], self.end[need] = 0, self.execute_steps
            return
        assert self.pending is not None
        self.pending[need] = new
        self.wait[need] = self.delay

    def arrive(self) -> None:
        """Chunks whose latency has passed replace the executing ones, from the action planned for now on."""
        if self.delay == 0 or self.pending is None or self.chunk is None:
            return
        on_way = self.wait > 0
        self.wait[on_way] -= 1
        now = on_way & (self.wait == 0)
        if now.any():
            h = self.chunk.shape[1]
            start = min(self.delay, h - 1)
            self.chunk[now] = self.pending[now]
            self.idx[now], self.end[now] = start, min(start + self.execute_steps, h)
            self.fresh_plan[now] = False

    def action(self, obs: Obs) -> torch.Tensor:
        assert self.chunk is not None
        h = self.chunk.shape[1]
        action = self.chunk[torch.arange(self.n), self.idx.clamp(max=h - 1)]
        if self.delay:  # waiting with no planned action left (or at an episode's start): the arm holds
            hold = (self.idx >= h) | self.fresh_plan
            if hold.any():
                held = getattr(self.env, "hold_action", None)
                action[hold] = held(obs)[hold].float().cpu() if held is not None else 0.0
        action = torch.maximum(torch.minimum(action, self.env.action_high), self.env.action_low)
        return self.enveloped(action, obs) if self.envelope is not None else action

    def enveloped(self, action: torch.Tensor, obs: Obs) -> torch.Tensor:
        """Each env's action through the robot's envelope: a refused one holds (and its env re-plans), a clamped one
        is sent clamped. The envelope's step and acceleration run from each env's last two actions."""
        held = getattr(self.env, "hold_action", None)
        present = held(obs).double() if held is not None else torch.full(action.shape, float("nan"))
        out = action.clone()
        for i in range(self.n):
            fresh = bool(self.idx[i] == 0 or self.length[i] == 0)
            prev = self.sent[-1][i].numpy() if self.sent and self.length[i] > 0 else None
            prev2 = self.sent[-2][i].numpy() if len(self.sent) > 1 and self.length[i] > 1 else None
            target, why = self.envelope.admit(action[i].double().numpy(), present[i].numpy(), prev, prev2, fresh)
            if why is None:
                continue
            if self.envelope.on_violation == "hold":
                self.refused += 1
                out[i] = present[i].float() if held is not None else 0.0
                self.idx[i] = self.end[i] = self.execute_steps  # the chunk is dropped: re-plan at the next step
            else:
                self.clamped += 1
                out[i] = torch.as_tensor(target, dtype=out.dtype)
        self.sent = [*self.sent[-1:], out.double()]
        return out

    def with_past(self, obs: Obs) -> Obs:
        """For a policy that reads `history` frames: `obs` with its previous frames (an env whose episode just
        started repeats its first frame, as LeRobot fills its observation queues)."""
        h = int(getattr(self.policy, "history", 1))
        if h <= 1:
            return obs
        if self.past is None:
            self.past = [obs] * (h - 1)
        elif self.fresh.any():
            self.past = [p.where(self.fresh, obs) for p in self.past]
        return Obs(obs.state, obs.images, obs.instructions, obs.env_state, list(self.past))

    def step(self, obs: Obs) -> Obs:
        obs = self.with_past(obs)
        obs = Obs(obs.state, obs.images, obs.instructions, obs.env_state, obs.past,
                  torch.stack([self.number, self.length], 1))  # each row's (episode, step): its noise's key
        for i in ((self.length == 0) & self.counted).nonzero().flatten().tolist():  # a counted episode's start
            self.initial[int(self.number[i])] = initial_digest(obs, i)
        self.arrive()  # what was asked `delay` steps ago, then what is asked now
        self.plan(obs)
        assert self.chunk is not None
        env = self.env
        action = self.action(obs)
        if self.rec is not None:
            label = action if self.labeler is None else self.labeler.act(obs).detach().float().cpu()
            for i in self.counted.nonzero().flatten().tolist():
                self.rec.record(i, obs, label)
        res = env.step(action)
        if self.past is not None:  # this frame becomes history; envs that finished start theirs afresh
            self.past = [*self.past[1:], Obs(obs.state, obs.images, obs.instructions, obs.env_state)]
            self.fresh = res.done.cpu().bool()
        self.env_steps += self.n
        self.idx += 1
        if self.delay == 0:
            self.idx[self.idx >= min(self.execute_steps, self.chunk.shape[1])] = self.execute_steps
            self.end[:] = self.execute_steps
        self.ret += res.reward.float().cpu()
        self.length += 1
        for i in res.done.nonzero().flatten().tolist():
            self.finish(i, bool(res.success[i]))
        return res.obs

    def finish(self, i: int, success: bool) -> None:
        """Env `i` ended an episode: count it if it was one of the first N to start, then start the next."""
        if self.counted[i]:
            self.results.append(Episode(i, success, float(self.ret[i]), int(self.length[i]), int(self.number[i])))
            self.successes += success
            if self.progress is not None:
                self.progress(len(self.results), self.successes, self.episodes)
            if self.rec is not None:
                traj = self.rec.pop(i)
                traj["success"], traj["episode"] = success, int(self.number[i])
                if self.record_rollouts:
                    self.trajectories.append(traj)
                if len(self.video_eps) < self.videos and traj["images"]:
                    self.video_eps.append(traj)
                elif self.videos and not success and traj["images"] and self.first_failure is None and \
                        all(e["success"] for e in self.video_eps):
                    self.first_failure = traj
        elif self.rec is not None:
            self.rec.pop(i)
        self.counted[i] = self.started < self.episodes
        self.number[i] = self.started
        self.started += int(self.counted[i])
        self.ret[i], self.length[i] = 0.0, 0
        self.idx[i] = self.end[i] = self.execute_steps  # re-plan from the new episode's first observation
        self.wait[i] = 0  # a chunk still on its way was planned in the episode that ended
        self.fresh_plan[i] = True

    def finished_prefix(self) -> int:
        """k: episodes 0..k-1 (start order) have all finished."""
        done = {e.index for e in self.results}
        k = 0
        while k in done:
            k += 1
        return k

    def outcomes(self, k: int) -> list[bool]:
        by = {e.index: e.success for e in self.results}
        return [by[i] for i in range(k)]

    def truncate(self, k: int) -> None:
        """Count episodes 0..k-1 only (the ones started after them are dropped whatever their outcome)."""
        self.results = [e for e in self.results if e.index < k]
        self.episodes = k

    def report(self) -> EvalReport:
        wall = time.perf_counter() - self.t0
        results, episodes = self.results, self.episodes
        succ = sum(e.success for e in results)
        lo, hi = wilson(succ, episodes)
        return EvalReport(
            task=self.env.task, policy=self.policy.name, backend=self.env.backend, episodes=episodes, successes=succ,
            success_rate=succ / episodes, ci_low=lo, ci_high=hi, mean_return=float(np.mean([e.ret for e in results])),
            mean_length=float(np.mean([e.length for e in results])), env_steps_per_s=self.env_steps / wall,
            policy_steps_per_s=self.policy_rows / self.policy_s if self.policy_s > 0 else 0.0, wall_s=wall,
            num_envs=self.n, versions=package_versions(), per_episode=[asdict(e) for e in results],
            plan_ms={q: round(float(np.percentile(self.call_ms, p)), 2) for q, p in (("p50", 50), ("p99", 99))}
            if self.call_ms else {},
            initial_states=(states := "".join(self.initial.get(e.index, "?" * 8)
                                              for e in sorted(results, key=lambda e: e.index))),
            initial_states_sha256=hashlib.sha256(states.encode()).hexdigest(),
            envelope={"refused": self.refused, "clamped": self.clamped, "steps": self.env_steps,
                      "envelope": self.envelope.describe()} if self.envelope is not None else None)


def initial_digest(obs: Obs, i: int) -> str:
    """Row `i`'s initial state as every policy meets it (the task's state vector and the instruction; not the scene
    state only a policy that reads it observes, so a model and the random baseline hash alike), rounded to 1e-4 so
    that a batch size's last-bit differences in the first physics step do not count, as a short digest. An
    evaluation's `initial_states` lists its episodes' digests in episode order (`initial_states_sha256` names the
    whole list): where two runs' lists differ on the episodes both played, they did not play the same initial states,
    and the gate does not pair them. What it cannot see: a layout the
    state does not carry (the SO-101's cube is in its scene state and cameras, not in its joint state)."""
    row = (np.round(obs.state[i].detach().float().cpu().numpy(), 4) + 0.0).tolist()  # + 0.0: no -0.0
    text = json.dumps([row, obs.instructions[i] if obs.instructions else ""])
    return hashlib.sha256(text.encode()).hexdigest()[:8]


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
    b.legend(loc="upper right")  # a fixed place: matplotlib's 'best' search warns (an error in the tests)
    fig.suptitle(f"{report.task} - {report.policy}: {report.success_rate:.2f} "
                 f"[{report.ci_low:.2f}, {report.ci_high:.2f}]")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def progress_printer(what: str, every: int | None = None, out: Callable[[str], None] = _stderr
                     ) -> Callable[[int, int, int], None]:
    """Prints `what: 16/48 episodes, 14 successes (87.5%)` every `every` episodes (default: eight lines a run)
    and at the last one, on stderr (stdout's last line stays the JSON result): what the Prefect log (which
    relays both) and the CLI show while a long evaluation runs."""

    def show(done: int, successes: int, total: int) -> None:
        step = every or max(1, total // 8)
        if done % step == 0 or done == total:
            out(f"{what}: {done}/{total} episodes, {successes} successes ({successes / done:.1%})")

    return show
