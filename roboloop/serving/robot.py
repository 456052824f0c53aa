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

import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


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


@dataclass
class Chunk:
    actions: np.ndarray  # (H, A)
    base: int  # the tick of the observation it was computed from
    version: str


@dataclass
class LoopStats:
    ticks: int = 0
    chunks: int = 0
    stalls: int = 0  # ticks that waited for a chunk (every first one; with prefetch, ideally no other)
    stale: int = 0  # prefetched chunks that arrived too late to use
    versions: Counter = field(default_factory=Counter)
    roundtrip_ms: list[float] = field(default_factory=list)
    overrun_ticks: int = 0  # realtime ticks that took longer than 1/fps
    held: int = 0  # ticks the robot held still because the server was lost or a chunk was refused
    refused: int = 0  # chunks the server or the client refused (not finite, another shape)
    server_losses: int = 0

    def summary(self) -> dict[str, Any]:
        rt = self.roundtrip_ms
        return {"ticks": self.ticks, "chunks": self.chunks, "stalls": self.stalls, "stale": self.stale,
                "versions": dict(self.versions), "overrun_ticks": self.overrun_ticks, "held": self.held,
                "refused": self.refused, "server_losses": self.server_losses,
                "roundtrip_ms_p50": round(float(np.percentile(rt, 50)), 2) if rt else None,
                "roundtrip_ms_p99": round(float(np.percentile(rt, 99)), 2) if rt else None}


def io_names(robot: RobotLike) -> tuple[list[str], list[str], list[str]]:
    """(state names, camera names, action names) in the robot's order."""
    obs = robot.observation_features
    state = [k for k, v in obs.items() if v is float]
    cams = [k for k, v in obs.items() if isinstance(v, tuple) and len(v) == 3]
    return state, cams, list(robot.action_features)


class RobotLoop:
    def __init__(self, robot: RobotLike, client: Any, cfg: RobotLoopConfig):
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
        self.holds = cfg.on_server_loss == "hold" or (cfg.on_server_loss == "auto" and not unheld)
        self.cam_of = {k: by_key[k] for k in self.camera_keys}
        self.cfg.execute_steps = max(1, min(cfg.execute_steps, int(spec["horizon"])))
        self.stats = LoopStats()
        self.chunk: Chunk | None = None
        self.pending: Future | None = None
        self.lost: Future | None = None  # the reconnection under way while the robot holds
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="roboloop-robot-request")
        self.episode, self.episode_tick = 0, 0  # this episode's number and first tick: each request's noise key
        self.last_tick = -1

    def _request(self, obs: dict[str, Any], tick: int) -> Chunk:
        state = np.asarray([float(obs[k]) for k in self.state_names], dtype=np.float32)
        images = {k: np.asarray(obs[c], dtype=np.uint8) for k, c in self.cam_of.items()}
        keys = [[self.episode, tick - self.episode_tick]]  # a sampling model draws as the Evaluator's would
        r = self.client.act(state, images, [self.cfg.instruction], retry=False, keys=keys)  # losses: `step` holds
        self.stats.roundtrip_ms.append(r.roundtrip_ms)
        self.stats.versions[r.version] += 1
        return Chunk(np.asarray(r.actions[0]), tick, r.version)

    def left(self, tick: int) -> int:
        return 0 if self.chunk is None else self.chunk.base + self.cfg.execute_steps - tick

    def reset(self) -> None:
        """A new episode (or an operator's stop): forget the current chunk, the next tick asks afresh and counts as
        the episode's first."""
        self._forget()
        self.episode, self.episode_tick = self.episode + 1, self.last_tick + 1

    def _forget(self) -> None:
        self.chunk = None
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None

    def _take(self, chunk: Chunk, tick: int) -> bool:
        """Execute `chunk` from this tick on (its actions for ticks already past are skipped); False if it came
        too late to have any left."""
        if tick - chunk.base >= min(len(chunk.actions), self.cfg.execute_steps):
            self.stats.stale += 1
            return False
        self.chunk = chunk
        self.stats.chunks += 1
        return True

    def step(self, tick: int) -> dict[str, Any]:
        """One tick: observe, (maybe) ask, act. Returns what the robot says it sent (LeRobot's robots clip to their
        limits and `max_relative_target`). When the server is lost: hold (or stop, ServerLostError)."""
        from roboloop.serving.client import ServerError, ServerLostError

        obs = self.robot.get_observation()
        self.last_tick = tick
        if self.lost is not None:
            return self._hold(obs)
        try:
            return self._step(obs, tick)
        except ServerLostError as e:
            self.stats.server_losses += 1
            if not self.holds:
                raise
            self._forget()
            self.lost = self.pool.submit(self.client.reopen, str(e))
            return self._hold(obs)
        except ServerError:  # a chunk refused (not finite, another shape): never executed; hold, ask again next tick
            self.stats.refused += 1
            if not self.holds:
                raise
            self._forget()
            return self._hold(obs)

    def _hold(self, obs: dict[str, Any]) -> dict[str, Any]:
        """The robot's present positions as its action while the client reconnects; the reconnection's failure (its
        budget spent) ends the loop."""
        if self.lost is not None and self.lost.done():
            lost, self.lost = self.lost, None
            lost.result()  # raises ServerLostError when no connection came back
        self.stats.held += 1
        self.stats.ticks += 1
        return self.robot.send_action({k: float(obs[k]) for k in self.action_names})

    def _step(self, obs: dict[str, Any], tick: int) -> dict[str, Any]:
        if self.pending is not None and (self.pending.done() or self.left(tick) <= 0):
            if not self.pending.done():  # nothing left to execute: the robot waits
                self.stats.stalls += 1
            got, self.pending = self.pending.result(), None
            self._take(got, tick)
        if self.left(tick) <= 0:  # no chunk yet, it ran out, or a prefetched one came too late: wait for one
            self.stats.stalls += 1
            self._take(self._request(obs, tick), tick)
        elif self.cfg.prefetch and self.left(tick) <= self.cfg.prefetch and self.pending is None and \
                self.chunk is not None and self.chunk.base != tick:
            self.pending = self.pool.submit(self._request, obs, tick)
        assert self.chunk is not None
        a = self.chunk.actions[tick - self.chunk.base]
        action = {k: float(v) for k, v in zip(self.action_names, a, strict=True)}
        sent = self.robot.send_action(action)
        self.stats.ticks += 1
        return sent

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
