"""An RL fine-tuning run on Ray: start the workers, alternate (sync) or overlap (async), checkpoint, publish.

sync:  every env worker collects a segment with the current weights; the learner updates on
       them; the new weights go to the rollout worker; repeat. Staleness is always 0.
async: every env worker always has a segment in flight; whenever `segments_per_update` have
       arrived and the learner is idle, it updates on them while the environments keep
       playing; new weights are broadcast to the rollout worker as soon as they exist, so a
       segment may mix versions (each decision carries its own). Launches are throttled so a
       segment started at version v is due for an update no later than v + max_staleness
       (at most (version + max_staleness + 1) x segments_per_update segments are ever launched);
       a segment older than that when its update starts is dropped (and counted).

Checkpoints (learner weights, optimizer, version, env steps) are written atomically every
`checkpoint_every` updates to output_dir/checkpoints; a rerun with the same config resumes.
The fine-tuned VLA is published as output_dir/model (model.safetensors, config.json with an
`rl` section naming its parent, stats.json), which `roboloop evaluate` and the registry read.
Ray is started locally unless `ray_address` names a cluster; every actor is killed and a local
Ray stopped on exit, on error, and on SIGTERM (a cancelled flow run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roboloop import fsutil
from roboloop.errors import RoboloopError
from roboloop.rl.config import RLConfig
from roboloop.rl.liveness import Liveness, MachineLost
from roboloop.training import checkpoint as ckpt


@dataclass
class RLResult:
    model_dir: str
    parent: str
    updates: int
    env_steps: int
    env_steps_per_s: float
    wall_s: float
    dropped_segments: int
    staleness_max: int
    rollout_success: list[float]

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


def _model_dir(policy: str) -> Path:
    if policy.startswith("registry:"):
        from roboloop.registry import resolve_model_ref

        return Path(resolve_model_ref(policy))
    p = Path(policy)
    if not (p / "model.safetensors").exists():
        raise RoboloopError(f"{policy}: not a model folder (no model.safetensors) or registry reference")
    from roboloop.policies import require

    require(p, "rl", "RL fine-tuning (flow-noise PPO)")
    return p


def get(refs: Any, watch: Callable[[], None] | None = None) -> Any:
    """`ray.get` that returns to Python every second, so SIGTERM (a cancelled flow run) interrupts a wait and
    `watch` (a Liveness) can end a wait on a lost machine."""
    import ray

    pending = list(refs) if isinstance(refs, list) else [refs]
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
        if pending and watch is not None:
            watch()
    return ray.get(refs)


def _start_ray(cfg: RLConfig) -> bool:
    import ray

    from roboloop.procs import own_sigterm

    if ray.is_initialized():
        return False
    with own_sigterm():
        if cfg.ray_address:
            ray.init(address=cfg.ray_address, log_to_driver=True)
            return False
        need = cfg.env_workers * cfg.env_cpus + 2
        ray.init(num_cpus=max(int(need + 0.999), os.cpu_count() or 1), num_gpus=None, include_dashboard=False,
                 log_to_driver=False, object_store_memory=256 * 1024 ** 2, configure_logging=False)
    return True


class _Workers:
    def __init__(self, cfg: RLConfig, model_dir: Path):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from roboloop.policies import model_info
        from roboloop.rl.workers import EnvWorker, Learner, RolloutWorker

        camera = bool(model_info(model_dir).camera_keys)
        rl = cfg.model_dump()
        bundles = [{"CPU": 1.0, "GPU": cfg.learner_gpus} if cfg.learner_gpus else {"CPU": 1.0},
                   {"CPU": 1.0, "GPU": cfg.rollout_gpus} if cfg.rollout_gpus else {"CPU": 1.0}]
        bundles += [{"CPU": cfg.env_cpus} for _ in range(cfg.env_workers)]
        self.pg = placement_group(bundles, strategy="STRICT_PACK" if cfg.placement == "colocated" else "SPREAD")
        ray.get(self.pg.ready(), timeout=300)  # resources only: fails fast if the cluster lacks them
        self.watch = Liveness.of(self.pg)  # the machines it placed the workers on

        def at(i: int):
            return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=i)

        threads = cfg.learner_threads
        if threads is None and not cfg.ray_address:  # a local cluster: share this machine's cores sensibly
            cores = os.cpu_count() or 1
            threads = cores if cfg.mode == "sync" else max(1, int(cores - cfg.env_workers * cfg.env_cpus - 1))
        # on a cluster the workers' machines do not have the driver's folder: its files go through the object store
        model: Any = str(model_dir) if not cfg.ray_address else ray.put(
            {p.name: p.read_bytes() for p in sorted(model_dir.iterdir()) if p.is_file()})
        self.learner: Any = ray.remote(Learner).options(
            num_cpus=1, num_gpus=cfg.learner_gpus, scheduling_strategy=at(0)).remote(
            model, rl, cfg.learner_device, cfg.seed, threads)
        self.rollout: Any = ray.remote(RolloutWorker).options(
            num_cpus=1, num_gpus=cfg.rollout_gpus, scheduling_strategy=at(1)).remote(
            model, rl, cfg.rollout_device, cfg.seed + 1)
        env_cls = ray.remote(EnvWorker)
        self.envs: list[Any] = [env_cls.options(num_cpus=cfg.env_cpus, scheduling_strategy=at(2 + i)).remote(
            i, cfg.task, cfg.envs_per_worker, cfg.seed * 1000 + i, cfg.execute_steps, cfg.discount(), camera,
            cfg.reward)
            for i in range(cfg.env_workers)]
        self.all: list[Any] = [self.learner, self.rollout, *self.envs]
        get([a.pid.remote() for a in self.all], self.watch)  # every worker is up (Isaac Lab started)
        self.hosts = get([a.host.remote() for a in self.all], self.watch)  # said in the progress

    def kill(self) -> None:
        """Best effort: after a SIGTERM to the process group the workers (and Ray's daemons) may be gone already."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self.all:
            with contextlib.suppress(Exception):  # already dead, or Ray is stopping
                ray.kill(a, no_restart=True)
        with contextlib.suppress(Exception):
            remove_placement_group(self.pg)


def _claim(cfg: RLConfig, out: Path) -> Path | None:
    """The checkpoint to resume from, after checking the folder is this run's (never another's)."""
    marker = out / "rl_run.json"
    if marker.exists():
        saved = json.loads(marker.read_text())
        changed = cfg.changed_fields(saved)
        if changed:
            raise RoboloopError(f"{out} holds another RL run (different {', '.join(changed)}); pick another "
                                "output_dir")
        return ckpt.latest(out / "checkpoints") if cfg.resume else None
    if out.exists() and any(out.iterdir()):
        raise RoboloopError(f"{out} exists and is not an RL run of roboloop's; refusing to write into it")
    out.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_json(marker, cfg.model_dump(mode="json"))
    return None


class Run:
    def __init__(self, cfg: RLConfig, on_event: Callable[[dict], None] = lambda e: None):
        self.cfg, self.on_event = cfg, on_event
        self.out = Path(cfg.output_dir).absolute()
        self.version = self.env_steps = self.dropped = self.stale_max = 0
        self.success: list[float] = []
        self.active_s = 0.0
        self._cpu_mark = (0.0, 0.0)  # (busy, total) CPU seconds at the last row; set when the loop starts

    def _record(self, metrics: dict, segs: list) -> None:
        eps = sum(s.episodes for s in segs)
        rets = [r for s in segs for r in s.returns]
        rate = sum(s.successes for s in segs) / eps if eps else None
        if rate is not None:
            self.success.append(round(rate, 4))
        self.stale_max = max(self.stale_max, metrics["staleness_max"])
        now = _cpu_times()
        busy, self._cpu_mark = busy_share(self._cpu_mark, now), now
        row = {**metrics, "collect_s": round(sum(g.finished - g.started for g in segs) / max(len(segs), 1), 3),
               "cpu_busy": round(busy, 3),
               "env_steps": self.env_steps, "episodes": eps, "rollout_success": rate,
               "mean_return": sum(rets) / len(rets) if rets else None, "dropped_segments": self.dropped,
               "wall_s": round(self.active_s + time.time() - self._t0, 2)}
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        self.on_event(row)
        every = self.cfg.checkpoint_every
        if every and self.version % every == 0:
            self._checkpoint()

    def _checkpoint(self) -> None:
        state = self._get(self.w.learner.state.remote())
        state.update(env_steps=self.env_steps, dropped=self.dropped, stale_max=self.stale_max,
                     success=self.success, active_s=self.active_s + time.time() - self._t0)
        ckpt.save(self.out / "checkpoints", self.version, state, self.cfg.keep_last)

    def _broadcast(self) -> None:
        """New weights (and the annealed noise cap for the budget spent so far) to the rollout worker before anything
        else is launched: a segment launched at version v then starts with v (its queued act calls finish first)."""
        if self.cfg.final_std is not None:  # no schedule: no round trip
            self._get(self.w.learner.anneal.remote(self.env_steps / self.cfg.env_steps))
        self._get(self.w.rollout.set_weights.remote(self.w.learner.weights.remote(), self.version))

    def _critic_only(self) -> bool:
        return self.version < self.cfg.critic_warmup_updates

    def _sync(self) -> None:
        cfg = self.cfg
        while self.env_steps < cfg.env_steps:
            segs: list = []
            while len(segs) < cfg.segments_per_update:
                segs += self._get([e.collect.remote(self.w.rollout, cfg.segment_decisions) for e in self.w.envs])
            self.env_steps += sum(s.env_steps for s in segs)
            metrics = self._get(self.w.learner.update.remote(segs, self._critic_only()))
            self.version = metrics["version"]
            self._broadcast()
            self._record(metrics, segs)

    def _async(self) -> None:
        import ray

        cfg, b, s = self.cfg, self.cfg.segments_per_update, self.cfg.max_staleness
        inflight: dict = {}
        idle = list(self.w.envs)
        buffer: list = []
        update_ref, update_segs = None, []
        # Segment i (launch order) is consumed in round i // b, which starts once the learner has finished
        # (rounds before it) - (rounds dropped whole) updates; launching i only while i < (updates done + s +
        # whole drops + 1) * b keeps that round's staleness <= s. Arrival out of launch order can still exceed
        # it: such a segment is dropped.
        launched = whole_drops = 0
        start_version = self.version
        planned = 0  # env steps of the segments launched: stop launching once they cover the budget
        per_seg = cfg.segment_decisions * cfg.execute_steps * cfg.envs_per_worker

        def launch() -> None:
            nonlocal launched, planned
            due = (self.version - start_version + s + whole_drops + 1) * b
            while idle and self.env_steps + planned < cfg.env_steps and launched < due:
                e = idle.pop(0)
                inflight[e.collect.remote(self.w.rollout, cfg.segment_decisions)] = e
                launched += 1
                planned += per_seg

        launch()
        while inflight or update_ref is not None or len(buffer) >= b:
            if update_ref is None and len(buffer) >= b:
                fresh = [g for g in buffer[:b] if self.version - int(g.version.min()) <= s]
                self.dropped += b - len(fresh)
                whole_drops += not fresh
                buffer = buffer[b:]
                if fresh:
                    update_ref = self.w.learner.update.remote(fresh, self._critic_only())
                    update_segs = fresh
                launch()
                continue
            ready: list = []
            while not ready:  # one-second waits: SIGTERM gets through
                ready, _ = ray.wait([*inflight, *([update_ref] if update_ref is not None else [])], num_returns=1,
                                    timeout=1.0)
                self.w.watch()
            ref = ready[0]
            if ref is update_ref:
                metrics = ray.get(ref)
                update_ref = None
                self.version = metrics["version"]
                self._broadcast()
                self._record(metrics, update_segs)
            else:
                seg = ray.get(ref)
                idle.append(inflight.pop(ref))
                planned -= per_seg
                self.env_steps += seg.env_steps
                buffer.append(seg)
            launch()

    def run(self) -> RLResult:
        import ray

        cfg = self.cfg
        model_dir = _model_dir(cfg.policy).absolute()
        resume_from = _claim(cfg, self.out)
        started = _start_ray(cfg)
        previous = signal.getsignal(signal.SIGTERM)

        terminated = []

        def _term(signum, frame):
            terminated.append(signum)
            raise KeyboardInterrupt("SIGTERM")

        if hasattr(signal, "SIGTERM") and _is_main_thread():
            signal.signal(signal.SIGTERM, _term)
        self.w: Any = None
        try:
            self.w = _Workers(cfg, model_dir)
            self.on_event({"workers": self.w.hosts})
            if resume_from is not None:
                state = ckpt.load(resume_from)
                self.version = self._get(self.w.learner.load_state.remote(state))
                self.env_steps, self.dropped = state["env_steps"], state["dropped"]
                self.stale_max, self.success, self.active_s = state["stale_max"], state["success"], state["active_s"]
                self.on_event({"resumed_from": str(resume_from), "version": self.version, "env_steps": self.env_steps})
            self._broadcast()
            self._t0, self._cpu_mark = time.time(), _cpu_times()
            try:
                self._sync() if cfg.mode == "sync" else self._async()
            except (ray.exceptions.ActorDiedError, MachineLost) as e:
                raise self._lost(e) from e
            wall = self.active_s + time.time() - self._t0
            self._checkpoint()
            weights = self._get(self.w.learner.vla_weights.remote())
            dst = self._publish(model_dir, weights)
        finally:
            # After SIGTERM to the process group (a cancelled flow run) Ray's own daemons got it too: killing
            # actors through a dead GCS would wait out its reconnect timeout, so only stop the local Ray.
            if self.w is not None and not terminated:
                self.w.kill()
            if started:
                ray.shutdown()
            if _is_main_thread():
                signal.signal(signal.SIGTERM, previous)
        return RLResult(str(dst), str(model_dir), self.version, self.env_steps,
                        round(self.env_steps / max(wall, 1e-9), 2), round(wall, 2), self.dropped, self.stale_max,
                        self.success)

    def _get(self, refs: Any) -> Any:
        return get(refs, self.w.watch)

    def _lost(self, e: Exception) -> RoboloopError:
        """A worker's machine (or the worker) gone: one line saying which, and what a rerun resumes from."""
        ip = getattr(e, "ip", None) or getattr(getattr(e, "_actor_init_failed", None), "ip", None) or next(
            (ln.split("ip:")[1].strip() for ln in str(e).splitlines() if ln.strip().startswith("ip:")), "?")
        why = "its machine was lost" if isinstance(e, MachineLost) or "node has died" in str(e) else "it died"
        done = ckpt.latest(self.out / "checkpoints")
        resume = f"rerun to resume from {done.name} ({self.out})" if done else "nothing was checkpointed yet"
        return RoboloopError(f"RL lost a worker at {ip}: {why} (Ray: {str(e).splitlines()[-1].strip()}); {resume}")

    def _publish(self, parent: Path, weights: dict) -> Path:

        from roboloop.policies import POLICY_FILE

        dst = self.out / "model"
        conf = json.loads((parent / "config.json").read_text())
        conf["model"]["initial_noise"] = self.cfg.x0  # it acts from the x_0 it was fine-tuned with
        conf["rl"] = {"parent": str(parent), "parent_config": conf.get("rl"), "updates": self.version,
                      "env_steps": self.env_steps, "config": self.cfg.model_dump(mode="json")}
        with fsutil.atomic_dir(dst, kind="rl-model", overwrite=True) as tmp:  # a previous one is moved aside
            shutil.copy2(parent / "stats.json", tmp / "stats.json")
            if (parent / POLICY_FILE).is_file():
                shutil.copy2(parent / POLICY_FILE, tmp / POLICY_FILE)
            (tmp / "config.json").write_text(json.dumps(conf, indent=2))
            fsutil.save_safetensors(weights, tmp / "model.safetensors")
        return dst


def _cpu_times() -> tuple[float, float]:
    """(busy, total) CPU seconds of this machine, all cores, as psutil counts them for `cpu_percent`. A row's
    `cpu_busy` is their ratio over its update: how much of the cores' time the run's workers (and anything else
    running) used; where sync already keeps them busy, no overlap (async) can add throughput on them."""
    import psutil

    t = psutil.cpu_times()
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # guest time is also in user time
    return total - t.idle - getattr(t, "iowait", 0.0), total


def busy_share(a: tuple[float, float], b: tuple[float, float]) -> float:
    """The busy share between two `_cpu_times()` readings, in [0, 1] (the sums of counters differ by rounding:
    an idle window can come out at -1e-12)."""
    return min(1.0, max(0.0, (b[0] - a[0]) / max(b[1] - a[1], 1e-9)))


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def run(cfg: RLConfig, on_event: Callable[[dict], None] = lambda e: None) -> RLResult:
    """One RL run into `cfg.output_dir`, locked for its whole length: a second run into the same folder at the
    same time is refused, naming the first one's pid."""
    out = Path(cfg.output_dir).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    with fsutil.exclusive(fsutil.lock_path_for(out), f"RL folder {out}"):
        return Run(cfg, on_event).run()


def progress_line(event: dict) -> str:
    """One readable line per update (the flow's log and the CLI's stderr)."""
    if "workers" in event:  # learner, rollout worker, then the environment workers
        hosts = event["workers"]
        envs = {h: hosts[2:].count(h) for h in dict.fromkeys(hosts[2:])}
        return (f"rl: learner on {hosts[0]}, rollout worker on {hosts[1]}, environment workers on "
                + ", ".join(f"{h} ({n})" for h, n in envs.items()))
    if "resumed_from" in event:
        return (f"rl: resumed at version {event['version']} ({event['env_steps']} env steps) "
                f"from {event['resumed_from']}")
    rate = event.get("rollout_success")
    return (f"rl: update {event['version']}{' (critic only)' if event.get('critic_only') else ''}, "
            f"{event['env_steps']} env steps, rollout success {'-' if rate is None else f'{rate:.0%}'}, "
            f"kl {event['approx_kl']:.3f}, staleness {event['staleness_max']}, noise {event['noise_std']:.3f}")


def rl_in_subprocess(cfg: RLConfig, on_line=print, timeout_s: float | None = None) -> dict:
    """Run RL in a child process group (its Ray workers die with it when the caller is cancelled); returns the
    JSON result."""
    from roboloop.warm import run_entry

    out = Path(cfg.output_dir).absolute()
    work = out.parent / f".{out.name}.rl"
    try:
        return run_entry("rl", cfg, work, on_line, timeout_s, f"RL fine-tuning of {cfg.policy} on {cfg.task}")
    finally:  # only the config file written there, and the folder if that leaves it empty
        (work / "rl_config.json").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            work.rmdir()


def read_metrics(out: str | Path) -> list[dict]:
    path = Path(out) / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def plot_metrics(rows: list[dict], png: Path, title: str) -> Path:
    """Rollout success and mean episode return against environment steps (one point per update)."""
    from roboloop import plots

    fig, (a, b) = plots.subplots(1, 2, figsize=(9, 3.2))
    pts = [(r["env_steps"], r["rollout_success"]) for r in rows if r.get("rollout_success") is not None]
    a.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3)
    a.set_ylim(0, 1.02)
    a.set_xlabel("environment steps")
    a.set_ylabel("rollout success (noisy policy)")
    ret = [(r["env_steps"], r["mean_return"]) for r in rows if r.get("mean_return") is not None]
    b.plot([p[0] for p in ret], [p[1] for p in ret], "o-", ms=3, color="tab:orange")
    b.set_xlabel("environment steps")
    b.set_ylabel("mean episode return")
    fig.suptitle(title)
    return plots.save(fig, png)
