"""`roboloop robot`: a robot (any of LeRobot's robot classes, or a simulator behind the same interface) driven by
chunks from a policy server.

The robot side of the train / simulate / act split. Each tick reads the robot's observation (LeRobot's
`get_observation()`: one float per joint, one HxWx3 frame per camera), executes the next action of the
current chunk (`send_action({name: value})`) and keeps the pace (`fps`). A chunk is executed for at most
`execute_steps` actions. With `prefetch` > 0, the next chunk is requested when that many actions of the
current one are left, from the observation of that tick, while the robot keeps moving (as LeRobot's async
inference does); when it arrives k ticks later, its first k actions (already in the past) are skipped.

The observation vector is the robot's float features in the robot's own order, which is how LeRobot's
recorder names `observation.state` (so a model trained on `lerobot-record` data, or on roboloop's SO-101 sim
recordings, reads the same vector); camera `front` is the model's `observation.images.front`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from roboloop.serving.envelope import MAX_ACCEL_DEG, MAX_FIRST_DEG, MAX_STEP_DEG, Envelope, envelope_for

log = logging.getLogger("roboloop.robot")


class RobotLike(Protocol):
    """What the loop uses of LeRobot's `lerobot.robots.Robot`."""

    @property
    def observation_features(self) -> dict: ...
    @property
    def action_features(self) -> dict: ...
    def get_observation(self) -> dict[str, Any]: ...
    def send_action(self, action: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class RobotLoopConfig:
    fps: float = 30.0  # control rate (the recording's)
    execute_steps: int = 8  # actions of a chunk executed before the next chunk must be there
    prefetch: int = 0  # ask for the next chunk when this many actions are left (0: ask when none is left)
    instruction: str = ""
    max_steps: int = 0  # 0: until interrupted
    realtime: bool = True  # False: no sleeping between ticks (a simulator that keeps its own time)
    # when the server goes away: "hold" sends the robot's present joint positions each tick while the client
    # reconnects (its `reconnect` budget), then resumes with a fresh chunk; "stop" ends the loop (ServerLostError);
    # "auto": hold where the robot observes a position for every action (LeRobot's arms), else stop
    on_server_loss: str = "auto"
    # the safety envelope (roboloop.serving.envelope), built from the robot: bounds in degrees per tick (None:
    # unbounded), limits from `limits_file` or the robot's calibration; what breaks it is refused and the arm holds
    # ("hold") or it is clamped in ("clamp"); "auto": hold where the robot observes a position for every action, else
    # clamp (a simulator whose actions are not positions)
    max_step: float | None = MAX_STEP_DEG
    max_accel: float | None = MAX_ACCEL_DEG
    max_first: float | None = MAX_FIRST_DEG
    on_violation: str = "auto"
    limits_file: str | None = None
    # a chunk's action for tick base+k is due k/fps after its observation; later than this (seconds) it is refused as
    # stale (None: the chunk's own length, horizon/fps). Wall-clock, so only with realtime
    max_lag_s: float | None = None


@dataclass
class Chunk:
    actions: np.ndarray  # (H, A)
    base: int  # the tick of the observation it was computed from
    version: str
    obs_time: float = 0.0  # when that observation was sent (time.time(), echoed by the server)


class ChunkRefused(RuntimeError):
    """A chunk (or one of its targets) that the robot will not execute: its text says why."""


class RobotFault(RuntimeError):
    """The robot itself failed (an action, even the hold, could not be sent): the loop ends, the arm is left with
    torque on at its last goal."""


@dataclass
class LoopStats:
    ticks: int = 0
    chunks: int = 0
    stalls: int = 0  # ticks that waited for a chunk (every first one; with prefetch, ideally no other)
    stale: int = 0  # prefetched chunks that arrived too late to use
    versions: Counter = field(default_factory=Counter)
    roundtrip_ms: list[float] = field(default_factory=list)
    overrun_ticks: int = 0  # realtime ticks that took longer than 1/fps
    held: int = 0  # ticks the robot held still: the server was lost, or a reply or chunk was refused
    refused: int = 0  # replies and chunks refused (the server's error, a malformed reply, the envelope, stale)
    violations: int = 0  # of those, targets or chunks outside the envelope (refused, or clamped with clamp)
    clamped: int = 0  # targets clamped into the envelope (on_violation clamp)
    server_losses: int = 0
    reasons: Counter = field(default_factory=Counter)  # why replies and chunks were refused (first words)

    def summary(self) -> dict[str, Any]:
        rt = self.roundtrip_ms
        return {"ticks": self.ticks, "chunks": self.chunks, "stalls": self.stalls, "stale": self.stale,
                "versions": dict(self.versions), "overrun_ticks": self.overrun_ticks, "held": self.held,
                "refused": self.refused, "violations": self.violations, "clamped": self.clamped,
                "server_losses": self.server_losses, "refusals": dict(self.reasons),
                "roundtrip_ms_p50": round(float(np.percentile(rt, 50)), 2) if rt else None,
                "roundtrip_ms_p99": round(float(np.percentile(rt, 99)), 2) if rt else None}


def io_names(robot: RobotLike) -> tuple[list[str], list[str], list[str]]:
    """(state names, camera names, action names) in the robot's order."""
    obs = robot.observation_features
    state = [k for k, v in obs.items() if v is float]
    cams = [k for k, v in obs.items() if isinstance(v, tuple) and len(v) == 3]
    return state, cams, list(robot.action_features)


class RobotLoop:
    def __init__(self, robot: RobotLike, client: Any, cfg: RobotLoopConfig, envelope: Envelope | None = None):
        self.robot, self.client, self.cfg = robot, client, cfg
        self.state_names, self.cams, self.action_names = io_names(robot)
        spec = client.info()
        self.camera_keys = list(spec["camera_keys"])
        by_key = {f"observation.images.{c}": c for c in self.cams} | {c: c for c in self.cams}
        missing = [k for k in self.camera_keys if k not in by_key]
        if len(self.state_names) != spec["state_dim"] or len(self.action_names) != spec["action_dim"] or missing:
            raise ValueError(f"the served model {spec['version']} reads a {spec['state_dim']}-dim state and cameras "
                             f"{self.camera_keys} and writes {spec['action_dim']} actions; the robot has "
                             f"{len(self.state_names)} joints {self.state_names}, cameras {self.cams} and "
                             f"{len(self.action_names)} actions" + (f" (no camera for {missing})" if missing else ""))
        if spec.get("env_state_dim"):  # LeRobot's robot classes observe joints and cameras, not the scene
            raise ValueError(f"the served model {spec['version']} reads observation.environment_state "
                             f"({spec['env_state_dim']} values of the scene's state) at every step, which a robot's "
                             "observation does not have: serve a model trained with env_state_input off")
        if cfg.on_server_loss not in ("auto", "hold", "stop"):
            raise ValueError(f"on_server_loss {cfg.on_server_loss!r}: auto, hold or stop")
        unheld = [a for a in self.action_names if a not in self.state_names]
        if cfg.on_server_loss == "hold" and unheld:
            raise ValueError(f"on_server_loss hold: the robot observes no position for actions {unheld}; use stop")
        on_violation = cfg.on_violation if cfg.on_violation != "auto" else "clamp" if unheld else "hold"
        self.envelope = envelope or envelope_for(robot, self.action_names, cfg.limits_file, cfg.max_step,
                                                 cfg.max_accel, cfg.max_first, on_violation)
        if list(self.envelope.names) != self.action_names:
            raise ValueError(f"the envelope is for {list(self.envelope.names)}, the robot acts on {self.action_names}")
        if self.envelope.on_violation == "hold" and unheld:
            raise ValueError(f"on_violation hold: the robot observes no position for actions {unheld}, so it cannot "
                             "hold them; use clamp")
        self.can_hold = not unheld  # the robot observes a position for every action: it can be told to stay there
        self.holds = cfg.on_server_loss == "hold" or (cfg.on_server_loss == "auto" and not unheld)
        self.cam_of = {k: by_key[k] for k in self.camera_keys}
        self.horizon = int(spec["horizon"])
        self.cfg.execute_steps = max(1, min(cfg.execute_steps, self.horizon))
        self.max_lag_s = cfg.max_lag_s if cfg.max_lag_s is not None else self.horizon / cfg.fps
        self.stats = LoopStats()
        self.chunk: Chunk | None = None
        self.pending: Future | None = None
        self.lost: Future | None = None  # the reconnection under way while the robot holds
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="roboloop-robot-request")
        self.episode, self.episode_tick = 0, 0  # this episode's number and first tick: each request's noise key
        self.last_tick = -1
        self.sent: list[np.ndarray] = []  # the last two targets sent (the envelope's step and acceleration)
        self.fresh = True  # the next target is the first of a chunk

    def _request(self, obs: dict[str, Any], tick: int) -> Chunk:
        state = np.asarray([float(obs[k]) for k in self.state_names], dtype=np.float32)
        images = {k: np.asarray(obs[c], dtype=np.uint8) for k, c in self.cam_of.items()}
        keys = [[self.episode, tick - self.episode_tick]]  # a sampling model draws as the Evaluator's would
        r = self.client.act(state, images, [self.cfg.instruction], retry=False, keys=keys)  # losses: `step` holds
        self.stats.roundtrip_ms.append(r.roundtrip_ms)
        self.stats.versions[r.version] += 1
        return Chunk(np.asarray(r.actions[0]), tick, r.version, r.timestamp)

    def left(self, tick: int) -> int:
        return 0 if self.chunk is None else self.chunk.base + self.cfg.execute_steps - tick

    def reset(self) -> None:
        """A new episode (or an operator's stop): forget the current chunk, the next tick asks afresh and counts as
        the episode's first."""
        self._forget()
        self.episode, self.episode_tick = self.episode + 1, self.last_tick + 1

    def _forget(self) -> None:
        self.chunk = None
        self.fresh = True
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None

    def _take(self, chunk: Chunk, tick: int) -> bool:
        """Execute `chunk` from this tick on (its actions for ticks already past are skipped); False if it came
        too late to have any left. ChunkRefused when what is left of it breaks the envelope (on_violation hold)."""
        start = tick - chunk.base
        if start >= min(len(chunk.actions), self.cfg.execute_steps):
            self.stats.stale += 1
            return False
        actions = np.asarray(chunk.actions)
        self._check_lag(chunk, start)
        if self.envelope.on_violation == "hold":
            why = self.envelope.check_chunk(actions[start:self.cfg.execute_steps])
            if why is not None:
                self.stats.violations += 1
                raise ChunkRefused(f"envelope: a chunk from {chunk.version}: {why}")
        self.chunk = chunk
        self.fresh = True
        self.stats.chunks += 1
        return True

    def step(self, tick: int) -> dict[str, Any]:
        """One tick: observe, (maybe) ask, check, act. Returns what the robot says it sent. Whatever goes wrong between
        the server and the motors (a lost server, a malformed or refused reply, a stale chunk, a target outside the
        envelope) holds the arm where it is this tick, with torque on; the loop asks afresh on the next."""
        from roboloop.serving.client import ServerLostError

        obs = self.robot.get_observation()
        self.last_tick = tick
        if self.lost is not None:
            return self._hold(obs)
        try:
            target = self._target(obs, tick)
        except ServerLostError as e:
            self.stats.server_losses += 1
            if not self.holds:  # stop: this tick still holds the arm where it is, then the loop ends
                if self.can_hold:
                    self._hold(obs)
                raise
            self._forget()
            self.lost = self.pool.submit(self.client.reopen, str(e))
            return self._hold(obs)
        except Exception as e:  # a refused, malformed or stale reply, or a chunk outside the envelope: never executed
            return self._refuse(obs, e)
        return self._send(target, obs)

    def _refuse(self, obs: dict[str, Any], e: Exception) -> dict[str, Any]:
        self.stats.refused += 1
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        self.stats.reasons[why.split(":")[0][:60]] += 1
        log.warning("refused (tick %d): %s", self.last_tick, why)
        if not self.can_hold:
            raise e
        self._forget()
        return self._hold(obs)

    def _present(self, obs: dict[str, Any]) -> np.ndarray:
        return np.asarray([float(obs.get(k, np.nan)) for k in self.action_names], dtype=np.float64)

    def _target(self, obs: dict[str, Any], tick: int) -> np.ndarray:
        """This tick's target from the current chunk (asking for one when needed), checked against the envelope."""
        chunk = self._chunk_for(obs, tick)
        k = tick - chunk.base
        self._check_lag(chunk, k)
        target, why = self.envelope.admit(chunk.actions[k], self._present(obs), self.sent[-1] if self.sent else None,
                                          self.sent[-2] if len(self.sent) > 1 else None, self.fresh)
        if why is not None:
            self.stats.violations += 1
            if self.envelope.on_violation == "hold":
                raise ChunkRefused(f"envelope: tick {tick}, {chunk.version}: {why}")
            self.stats.clamped += 1
            log.warning("clamped (tick %d): %s", tick, why)
        return target

    def _check_lag(self, chunk: Chunk, k: int) -> None:
        """Action k of `chunk` is due k/fps after its observation; much later, the world it planned for is gone."""
        if self.cfg.realtime and chunk.obs_time:
            lag = time.time() - (chunk.obs_time + k / self.cfg.fps)
            if lag > self.max_lag_s:
                raise ChunkRefused(f"stale: action {k} of a chunk from {chunk.version} is {lag * 1e3:.0f} ms late "
                                   f"(its observation was {(time.time() - chunk.obs_time) * 1e3:.0f} ms ago; "
                                   f"at most {self.max_lag_s * 1e3:.0f} ms late)")

    def _chunk_for(self, obs: dict[str, Any], tick: int) -> Chunk:
        if self.pending is not None and (self.pending.done() or self.left(tick) <= 0):
            if not self.pending.done():  # nothing left to execute: the robot waits
                self.stats.stalls += 1
            pending, self.pending = self.pending, None
            self._take(pending.result(), tick)
        if self.left(tick) <= 0:  # no chunk yet, it ran out, or a prefetched one came too late: wait for one
            self.stats.stalls += 1
            self._take(self._request(obs, tick), tick)
        elif self.cfg.prefetch and self.left(tick) <= self.cfg.prefetch and self.pending is None and \
                self.chunk is not None and self.chunk.base != tick:
            self.pending = self.pool.submit(self._request, obs, tick)
        if self.chunk is None or self.left(tick) <= 0:
            raise ChunkRefused("no chunk to execute (the one that came was too late)")
        return self.chunk

    def _send(self, target: np.ndarray, obs: dict[str, Any]) -> dict[str, Any]:
        try:
            sent = self._send_values(target)
        except Exception as e:  # the robot refused it (LeRobot's encoder, a bus error): hold, with torque on
            return self._refuse(obs, e)
        self.sent = [*self.sent[-1:], np.asarray(target, np.float64)]
        self.fresh = False
        self.stats.ticks += 1
        return sent

    def _send_values(self, values: np.ndarray) -> dict[str, Any]:
        return self.robot.send_action({k: float(v) for k, v in zip(self.action_names, values, strict=True)})

    def _hold(self, obs: dict[str, Any]) -> dict[str, Any]:
        """The robot's present positions as its action (the arm stays where it is, torque on) while the client
        reconnects or after a refusal; the reconnection's failure (its budget spent) ends the loop."""
        if self.lost is not None and self.lost.done():
            lost, self.lost = self.lost, None
            lost.result()  # raises ServerLostError when no connection came back
        self.stats.held += 1
        self.stats.ticks += 1
        present = self._present(obs)
        if not np.isfinite(present).all():  # a reading the arm cannot be at: keep the last goal instead
            present = self.sent[-1] if self.sent else present
        self.sent, self.fresh = [present, present], True  # at rest: the next chunk starts from here
        try:
            return self._send_values(present)
        except Exception as e:
            raise RobotFault(f"the robot refused its own present positions as a hold ({type(e).__name__}: {e})") \
                from e

    def rest(self, ticks: int = 15, tolerance: float = 0.5) -> None:
        """Bring the arm to rest before an operator's stop lets it go: hold the present positions until two readings
        in a row differ by less than `tolerance` (robot units) or `ticks` have passed."""
        before = None
        for _ in range(ticks):
            obs = self.robot.get_observation()
            present = self._present(obs)
            if not np.isfinite(present).all():
                return
            self._send_values(present)
            if before is not None and np.abs(present - before).max() < tolerance:
                return
            before = present
            if self.cfg.realtime:
                time.sleep(1.0 / self.cfg.fps)

    def run(self, on_tick: Any = None) -> LoopStats:
        """Ticks until `max_steps` (or Ctrl-C); `on_tick(tick, action)` after each (a simulator's bookkeeping)."""
        period, tick = 1.0 / self.cfg.fps, 0
        next_t = time.perf_counter()
        try:
            while not self.cfg.max_steps or tick < self.cfg.max_steps:
                action = self.step(tick)
                if on_tick is not None:
                    on_tick(tick, action)
                tick += 1
                if self.cfg.realtime:
                    next_t += period
                    wait = next_t - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    else:
                        self.stats.overrun_ticks += 1
                        next_t = time.perf_counter()
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
        return self.stats
