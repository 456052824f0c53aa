"""The robot's own safety envelope: what any action must satisfy before it reaches a motor, whatever the server, the
registry or the network said.

A policy server is a program on another machine; a promoted model is whatever the gate let through. Neither may move
an arm beyond what the arm itself allows (ROS 2's `ros2_control` enforces joint limits in the hardware interface for
the same reason). The envelope is built from the robot, not from the model:

- **position limits** per joint: the calibrated range LeRobot's motor bus records for each servo (in the units
  `send_action` takes: degrees, or percent of the range for a gripper), a limits file for an arm roboloop does not
  know, or a simulator's action bounds;
- **a step bound** (`max_step`, robot units per tick): no target further than that from the previous one;
- **an acceleration bound** (`max_accel`, units per tick per tick): no change of step larger than that;
- **a first-action bound** (`max_first`): each chunk's first executed target within that of the present position.

A chunk is checked whole when it arrives (limits, steps and accelerations inside it) and each target again when it is
sent (its step and acceleration from the previous targets, the first one's distance from where the arm is). What
breaks the envelope is refused (`on_violation="hold"`: the arm holds its present position and the loop asks for a
new chunk) or clamped into it (`"clamp"`); either way it is counted and logged with the joint and the value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# defaults for an arm whose joints move in degrees (LeRobot's SO-100/101, Koch, ... with use_degrees), at the edge
# of what the arm does on its own: 10 degrees a tick is 300 deg/s at 30 fps, about an STS3215's top speed (~270 deg/s
# unloaded at 7.4 V); a step may change by 10 degrees a tick (rest to full speed in one tick, but no reversal at
# speed); a chunk's first target within 15 degrees of where the joint is. The SO-101 task's scripted expert, whose
# demonstrations the presets' policies learn, moves at most 8 degrees a tick with its targets at most ~10 degrees
# ahead of the arm (tests/unit/serving/test_envelope.py checks it plays inside the envelope); a +-90 degree jump is
# far outside. Tighter for a first run on a new arm: --max-step-deg 3
MAX_STEP_DEG = 10.0
MAX_ACCEL_DEG = 10.0
MAX_FIRST_DEG = 15.0
ON_VIOLATION = ("hold", "clamp")


class EnvelopeViolation(ValueError):
    """An action outside the robot's envelope; its text names the joint, the value and the bound."""


@dataclass(frozen=True)
class Envelope:
    """Per joint (in `names`' order, the robot's action order): limits and bounds in the robot's own units."""

    names: tuple[str, ...]
    low: np.ndarray
    high: np.ndarray
    max_step: np.ndarray  # inf: unbounded
    max_accel: np.ndarray
    max_first: np.ndarray
    on_violation: str = "hold"
    source: str = ""  # where the limits came from, for the start-up line

    def __post_init__(self) -> None:
        if self.on_violation not in ON_VIOLATION:
            raise ValueError(f"on_violation {self.on_violation!r}: hold or clamp")
        for what in ("low", "high", "max_step", "max_accel", "max_first"):
            v = getattr(self, what)
            if np.shape(v) != (len(self.names),) or np.isnan(v).any():
                raise ValueError(f"envelope {what}: {len(self.names)} numbers for {list(self.names)}, got {v!r}")
        bad = [n for n, lo, hi in zip(self.names, self.low, self.high, strict=True) if not lo < hi]
        if bad:
            raise ValueError(f"envelope: the limits of {bad} are empty (low >= high)")

    def describe(self) -> str:
        def one(v: np.ndarray) -> str:
            return "none" if np.isinf(v).all() else f"{float(np.min(v)):g}..{float(np.max(v)):g}"

        return (f"limits from {self.source or 'the caller'}; step <= {one(self.max_step)}, acceleration <= "
                f"{one(self.max_accel)}, first target within {one(self.max_first)} of the arm, per tick; "
                f"on violation: {self.on_violation}")

    def check_chunk(self, actions_HA: np.ndarray) -> str | None:
        """Why this chunk leaves the envelope (its first violation: limits, then steps, then accelerations inside
        it), or None."""
        a = np.asarray(actions_HA, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != len(self.names):
            return f"a chunk of shape {a.shape} for {len(self.names)} joints"
        if not np.isfinite(a).all():
            return "a chunk with non-finite values"
        out = (a < self.low) | (a > self.high)
        if out.any():
            k, j = np.argwhere(out)[0]
            return (f"action {k}: {self.names[j]} {a[k, j]:.6g} outside its limits "
                    f"[{self.low[j]:.6g}, {self.high[j]:.6g}]")
        return _first_excess(np.diff(a, axis=0), self.max_step, self.names, "step", 1) or \
            _first_excess(np.diff(a, n=2, axis=0), self.max_accel, self.names, "acceleration", 2)

    def admit(self, target: np.ndarray, present: np.ndarray, prev: np.ndarray | None, prev2: np.ndarray | None,
              first: bool) -> tuple[np.ndarray, str | None]:
        """The target to send this tick and, when `target` broke the envelope, why. `prev`/`prev2`: the last two
        targets sent (None before there were any); `first`: this is the first target of a chunk. With hold the
        returned target is meaningless when a reason is given (the caller holds); with clamp it is the nearest
        target inside the envelope."""
        t = np.asarray(target, dtype=np.float64)
        why = None
        if not np.isfinite(t).all():
            return t, "a non-finite target"
        clamped = np.clip(t, self.low, self.high)
        if (clamped != t).any():
            j = int(np.argmax(clamped != t))
            why = f"{self.names[j]} {t[j]:.6g} outside its limits [{self.low[j]:.6g}, {self.high[j]:.6g}]"
        base = prev if prev is not None else present
        lo, hi = base - self.max_step, base + self.max_step
        if prev is not None and prev2 is not None:  # the step may change by max_accel at most
            lo = np.maximum(lo, base + (prev - prev2) - self.max_accel)
            hi = np.minimum(hi, base + (prev - prev2) + self.max_accel)
            lo, hi = np.minimum(lo, base), np.maximum(hi, base)  # stopping is always allowed
        if first:
            lo, hi = np.maximum(lo, present - self.max_first), np.minimum(hi, present + self.max_first)
            lo, hi = np.minimum(lo, hi), np.maximum(lo, hi)
        # a joint whose position the robot does not report (NaN) is bounded by its limits alone
        lo, hi = np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi)
        step_ok = np.clip(clamped, lo, hi)
        if why is None and (step_ok != clamped).any():
            j = int(np.argmax(step_ok != clamped))
            kind = "its first target" if first and abs(t[j] - present[j]) > self.max_first[j] else "its step"
            why = (f"{self.names[j]} {t[j]:.6g}: {kind} from {base[j] if kind == 'its step' else present[j]:.6g} "
                   f"breaks the envelope (step <= {self.max_step[j]:g}, acceleration <= {self.max_accel[j]:g}, "
                   f"first <= {self.max_first[j]:g})")
        return np.clip(step_ok, self.low, self.high), why


def _first_excess(d: np.ndarray, bound: np.ndarray, names: tuple[str, ...], what: str, lag: int) -> str | None:
    over = np.abs(d) > bound
    if not over.any():
        return None
    k, j = np.argwhere(over)[0]
    return f"action {k + lag}: {names[j]} {what} {d[k, j]:.6g} over its bound {bound[j]:g}"


def _envelope(names: list[str], low: list[float], high: list[float], units: list[str], scale: dict[str, float],
              degrees: tuple[float | None, ...], on_violation: str, source: str) -> Envelope:
    """An Envelope from limits and its (step, acceleration, first) bounds in degrees: each as given on degree joints,
    converted for percent joints by `scale` (percent per degree of that joint), unbounded elsewhere or when None."""
    per_joint = []
    for value in degrees:
        v = np.full(len(names), math.inf)
        for i, (n, u) in enumerate(zip(names, units, strict=True)):
            if value is None:
                continue
            if u == "deg":
                v[i] = value
            elif u == "percent" and n in scale:
                v[i] = value * scale[n]
        per_joint.append(v)
    step, accel, first = per_joint
    return Envelope(tuple(names), np.asarray(low, np.float64), np.asarray(high, np.float64), step, accel, first,
                    on_violation, source)


def from_bus(robot: Any, names: list[str]) -> tuple[list[float], list[float], list[str], dict[str, float]]:
    """Limits from LeRobot's motor bus (`robot.bus`): each motor's calibrated range in the units `send_action`
    takes, computed as LeRobot's `MotorsBus._normalize` maps raw positions."""
    from lerobot.motors import MotorNormMode

    bus = robot.bus
    if not bus.calibration:
        raise ValueError(f"{robot}: its motor bus has no calibration, so no joint limits: calibrate it first "
                         "(lerobot-calibrate) or pass --limits FILE")
    low, high, units, scale = [], [], [], {}
    for name in names:
        motor = name.removesuffix(".pos")
        if motor not in bus.motors or motor not in bus.calibration:
            raise ValueError(f"{robot}: action {name} has no calibrated motor on its bus; pass --limits FILE")
        cal, m = bus.calibration[motor], bus.motors[motor]
        res = bus.model_resolution_table[m.model] - 1
        if m.norm_mode is MotorNormMode.DEGREES:
            mid = (cal.range_min + cal.range_max) / 2
            low.append((cal.range_min - mid) * 360 / res)
            high.append((cal.range_max - mid) * 360 / res)
            units.append("deg")
        else:
            lo = -100.0 if m.norm_mode is MotorNormMode.RANGE_M100_100 else 0.0
            low.append(lo)
            high.append(100.0)
            units.append("percent")
            # percent of the range per degree of the servo: a degree bound means the same motion
            scale[name] = (100.0 - lo) / ((cal.range_max - cal.range_min) * 360 / res)
    return low, high, units, scale


def read_limits_file(path: str | Path, names: list[str]) -> tuple[list[float], list[float], list[str]]:
    """`{"shoulder_pan.pos": {"min": -90, "max": 90, "units": "deg"}, ...}`: every action of the robot named."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--limits {path}: cannot be read ({e})") from None
    missing = [n for n in names if n not in data]
    if missing:
        raise ValueError(f"--limits {path}: no limits for {missing} (the robot's actions: {names})")
    low, high, units = [], [], []
    for n in names:
        d = data[n]
        if not isinstance(d, dict) or not all(isinstance(d.get(k), (int, float)) for k in ("min", "max")):
            raise ValueError(f"--limits {path}: {n} needs numbers min and max, got {d!r}")
        low.append(float(d["min"]))
        high.append(float(d["max"]))
        units.append(str(d.get("units", "deg")))
    return low, high, units


def envelope_for(robot: Any, names: list[str], limits_file: str | None = None, max_step: float | None = None,
                 max_accel: float | None = None, max_first: float | None = None,
                 on_violation: str = "hold") -> Envelope:
    """The envelope of `robot` (its action names `names`): limits from `limits_file`, else its motor bus's
    calibration (LeRobot's robots), else its own `joint_limits()` (a simulator's action bounds: `{name: (low, high,
    units)}`); refused when none says. Bounds in degrees (None: unbounded)."""
    scale: dict[str, float] = {}
    if limits_file:
        low, high, units = read_limits_file(limits_file, names)
        source = str(limits_file)
    elif getattr(robot, "bus", None) is not None and hasattr(robot.bus, "calibration"):
        low, high, units, scale = from_bus(robot, names)
        source = f"{robot}'s calibration"
    elif hasattr(robot, "joint_limits"):
        lim = robot.joint_limits()
        low, high, units = ([float(lim[n][0]) for n in names], [float(lim[n][1]) for n in names],
                            [str(lim[n][2]) for n in names])
        source = f"{getattr(robot, 'name', type(robot).__name__)}'s joint limits"
    else:
        raise ValueError(f"no joint limits are known for {type(robot).__name__}: pass --limits FILE "
                         '({"JOINT.pos": {"min": ..., "max": ..., "units": "deg"}, ...})')
    return _envelope(names, low, high, units, scale, (max_step, max_accel, max_first), on_violation, source)


def task_units(name: str) -> str:
    """A simulated task's action units as the envelope reads them: LeRobot's schema (`*.pos`, the SO-101's) in
    degrees but its gripper (percent, left to its limits alone); other tasks' actions in units of their own."""
    return "deg" if name.endswith(".pos") and name != "gripper.pos" else "raw"


def for_task(env: Any, names: list[str], max_step: float | None = MAX_STEP_DEG, max_accel: float | None = MAX_ACCEL_DEG,
             max_first: float | None = MAX_FIRST_DEG, on_violation: str = "auto") -> Envelope:
    """The envelope `roboloop robot` would apply to a simulated robot of `env`'s task (its action bounds as the
    limits, the bounds on joints in degrees), for an evaluation that measures what a robot would refuse;
    on_violation auto: hold where the env can hold the arm (`hold_action`), else clamp."""
    low, high = env.action_low.tolist(), env.action_high.tolist()
    units = [task_units(n) for n in names]
    if on_violation == "auto":
        on_violation = "hold" if hasattr(env, "hold_action") else "clamp"
    return _envelope(names, low, high, units, {}, (max_step, max_accel, max_first), on_violation,
                     f"{env.task}'s action bounds")
