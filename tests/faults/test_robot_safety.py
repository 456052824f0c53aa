"""`roboloop robot`'s envelope against a hostile or buggy policy server, on LeRobot's own SO-101 follower.

The robot is LeRobot 0.6.1's `SOFollower` (its motor bus, the Feetech SDK's packets) with only the serial port
replaced by servos that record every goal (tests/servos.py); the server speaks the real wire protocol (websocket +
msgpack, `roboloop.serving.wire`) and answers each request as a hostile or broken server would. Whatever it sends,
no servo is told a goal outside its calibrated range or a step over the bound, torque stays on, and the loop holds.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from roboloop.serving import wire
from roboloop.serving.client import PolicyClient
from roboloop.serving.robot import RobotLoop, RobotLoopConfig
from tests.servos import MOTORS, calibration, servo_bus

pytest.importorskip("scservo_sdk")
HORIZON, TOKEN = 8, "t" * 32
SPEC = {"version": "v-hostile", "state_dim": 6, "action_dim": 6, "horizon": HORIZON, "camera_keys": [],
        "state_key": "observation.state", "image_size": None, "history": 1, "env_state_dim": 0}
STEP_RAW = 10.0 * 4095 / 360  # the default step bound (10 degrees) in raw servo units


def _chunk(mode: str, state: np.ndarray, n: int) -> np.ndarray:
    k = np.arange(1, HORIZON + 1, dtype=np.float32)[:, None]
    if mode == "jumps":  # +-90 degrees, alternating every action: a 180-degree jump a tick
        return np.where(k % 2 == 0, 90.0, -90.0).repeat(6, 1).astype(np.float32)
    if mode == "out_of_range":
        return np.where(k % 2 == 0, 170.0, -170.0).repeat(6, 1).astype(np.float32)
    if mode == "far":  # smooth, but it starts 60 degrees from where the arm is
        return (state[None] + 60.0 + 0.5 * k).astype(np.float32)
    return (state[None] + 0.5 * k).astype(np.float32)  # smooth: half a degree a tick from where the arm is


class HostileServer:
    """A policy server on the real wire protocol whose `act` replies follow `mode`."""

    def __init__(self, mode: str):
        from websockets.sync.server import serve

        self.mode, self.first_reply, self.requests, self.sessions = mode, None, 0, []
        self.server = serve(self._session, "127.0.0.1", 0, max_size=wire.MAX_MESSAGE_BYTES)
        self.port = self.server.socket.getsockname()[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _session(self, ws) -> None:
        self.sessions.append(ws)
        for data in ws:
            msg = wire.loads(data)
            if msg["type"] == "info":
                ws.send(wire.dumps({"type": "info", "id": msg["id"], "model": SPEC}))
                continue
            self.requests += 1
            ws.send(self._reply(msg))

    def _reply(self, msg: dict) -> bytes | str:
        state = np.asarray(msg["state"][0], np.float32)
        out = {"type": "chunk", "id": msg["id"], "timestamp": msg["timestamp"], "version": SPEC["version"],
               "infer_ms": 1.0, "batch": 1, "actions": _chunk(self.mode, state, 1)[None]}
        mode = self.mode
        if mode == "garbage":
            return b"\xc1\xff\x00 not msgpack"
        if mode == "text":
            return "a text frame"
        if mode == "long_note":
            out["note"] = "x" * (1 << 20 | 1)
        if mode == "float64":
            out["actions"] = out["actions"].astype(np.float64)
        if mode == "int":
            out["actions"] = out["actions"].astype(np.int32)
        if mode == "hour_old":
            out["timestamp"] = msg["timestamp"] - 3600.0
        if mode == "slow":  # computed from an observation 0.5 s old by the time it arrives
            time.sleep(0.5)
        data = wire.dumps(out)
        if mode == "replay":  # every request gets the first reply again (its id, its observation's time)
            self.first_reply = self.first_reply or data
            return self.first_reply
        return data

    def close(self) -> None:
        """Gone: no new connection is accepted and the open ones are closed."""
        self.server.shutdown()
        for ws in self.sessions:
            ws.close()


@pytest.fixture
def arm(tmp_path):
    """LeRobot's SO-101 follower, connected, on recorded servos calibrated to 1024..3072 (the gripper 2000..3400)."""
    from lerobot.robots.so_follower import SO101Follower, SO101FollowerConfig

    cal = calibration()
    (tmp_path / "arm.json").write_text(json.dumps(cal))
    with servo_bus(cal) as bus:
        robot = SO101Follower(SO101FollowerConfig(port=bus.port, id="arm", calibration_dir=tmp_path))
        robot.connect()
        bus.goals.clear()
        bus.torque_writes.clear()
        yield robot, bus, cal
        if robot.is_connected:
            robot.disconnect()


def _drive(robot, mode: str, ticks: int = 40, **cfg) -> tuple:
    # a tick that a busy machine delays (two test workers on two cores) may make a chunk late, and a late chunk is
    # rightly refused: only the tests of late replies ("slow", "hour_old") keep the chunk's own length as the bound
    if mode not in ("slow", "hour_old"):
        cfg.setdefault("max_lag_s", 2.0)
    server = HostileServer(mode)
    try:
        client = PolicyClient(f"serve://127.0.0.1:{server.port}", token=TOKEN, timeout=2.0, reconnect=3,
                              backoff_s=0.05)
        loop = RobotLoop(robot, client, RobotLoopConfig(fps=50, execute_steps=4, max_steps=ticks, **cfg))
        stats = loop.run()
        client.close()
    finally:
        server.close()
    return loop, stats


def _goals(bus) -> dict[int, list[int]]:
    per: dict[int, list[int]] = {}
    for motor_id, goal in bus.goals:
        per.setdefault(motor_id, []).append(goal)
    return per


def _assert_safe(bus, cal, torque: bool = True) -> None:
    """Every goal inside its servo's calibrated range, no step over the bound, torque never turned off."""
    for motor_id, goals in _goals(bus).items():
        c = cal[MOTORS[motor_id - 1]]
        assert c["range_min"] <= min(goals) and max(goals) <= c["range_max"], (motor_id, min(goals), max(goals))
        assert np.abs(np.diff(goals)).max(initial=0) <= STEP_RAW + 1, (motor_id, np.diff(goals))
    assert not torque or all(on for _, on in bus.torque_writes), bus.torque_writes


def test_a_smooth_server_moves_the_arm_through_the_envelope(arm):
    robot, bus, cal = arm
    loop, stats = _drive(robot, "smooth")
    assert stats.held == 0 and stats.refused == 0 and stats.ticks == 40
    pan = _goals(bus)[1]
    assert pan[-1] - pan[0] > 100  # it moved: half a degree a tick, 40 ticks (~20 degrees, ~227 raw)
    _assert_safe(bus, cal)


@pytest.mark.parametrize("mode", ["jumps", "out_of_range", "far"])
def test_violent_chunks_are_refused_and_the_arm_holds(arm, mode):
    robot, bus, cal = arm
    loop, stats = _drive(robot, mode)
    assert stats.violations >= 1 and stats.held == stats.ticks == 40 and stats.chunks == 0, stats.summary()
    assert any(k.startswith("envelope") for k in stats.reasons), stats.reasons
    goals = _goals(bus)
    assert all(len(set(g)) == 1 for g in goals.values()), goals  # held still: the same goal every tick
    _assert_safe(bus, cal)


@pytest.mark.parametrize("mode", ["garbage", "text", "long_note", "float64", "int", "hour_old", "replay", "slow"])
def test_malformed_stale_or_replayed_replies_hold_the_arm_with_torque_on(arm, mode):
    robot, bus, cal = arm
    ticks = 6 if mode == "slow" else 30  # each slow reply takes 0.5 s
    loop, stats = _drive(robot, mode, ticks=ticks)
    assert stats.ticks == ticks and stats.held >= 1 and stats.chunks - (mode == "replay") <= 0, stats.summary()
    genuine = 4 if mode == "replay" else 0  # the replayed reply was genuine the first time: its 4 actions ran
    assert all(len(set(g[genuine:])) == 1 for g in _goals(bus).values())  # nothing else reached a servo
    _assert_safe(bus, cal)
    assert robot.is_connected


def test_clamp_keeps_every_target_inside_and_counts_it(arm):
    robot, bus, cal = arm
    loop, stats = _drive(robot, "out_of_range", on_violation="clamp")
    assert stats.clamped >= 30 and stats.held == 0, stats.summary()
    _assert_safe(bus, cal)
    pan = _goals(bus)[1]
    assert max(pan) - min(pan) > 0  # it moved, a bounded step at a time


def test_roboloop_robot_ends_a_lost_server_holding_the_arm_with_torque_on(arm, tmp_path, capsys):
    """The command, on LeRobot's robot: the server goes away for good, the loop ends (exit 3), and the arm is left
    holding its present position (LeRobot's default would turn torque off on disconnect: the arm drops)."""
    from roboloop.cli.main import main

    robot, bus, cal = arm
    robot.disconnect()  # the command connects its own
    server = HostileServer("smooth")
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    threading.Timer(1.0, server.close).start()
    code = main(["robot", "--server", f"127.0.0.1:{server.port}", "--robot.port", bus.port, "--robot.id", "arm",
                 "--robot.calibration-dir", str(tmp_path), "--token-file", str(tmp_path / "token"),
                 "--on-server-loss", "stop", "--fps", "50", "--max-steps", "1000"])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "torque left on" in err and "envelope: limits from" in err
    last_torque = {}
    for motor_id, on in bus.torque_writes:
        last_torque[motor_id] = on
    assert all(last_torque[i] == 1 for i in range(1, 7)), bus.torque_writes  # connect turned it off, then on
    _assert_safe(bus, cal, torque=False)
    assert robot.config.max_relative_target is None  # the fixture's object; the command's got the step bound


def test_a_limits_file_gives_an_arm_roboloop_does_not_know_its_envelope(tmp_path):
    from roboloop.serving.envelope import envelope_for

    class Arm:  # no motor bus, no joint_limits
        pass

    names = [f"{m}.pos" for m in MOTORS]
    with pytest.raises(ValueError, match="no joint limits are known for Arm: pass --limits FILE"):
        envelope_for(Arm(), names)
    limits = tmp_path / "limits.json"
    limits.write_text(json.dumps({n: {"min": -10, "max": 20} for n in names[:-1]}))
    with pytest.raises(ValueError, match=r"no limits for \['gripper.pos'\]"):
        envelope_for(Arm(), names, str(limits))
    limits.write_text(json.dumps({n: {"min": -10, "max": 20} for n in names}))
    env = envelope_for(Arm(), names, str(limits), max_step=5)
    assert env.check_chunk(np.full((3, 6), 21.0)) == "action 0: shoulder_pan.pos 21 outside its limits [-10, 20]"
    assert "step 10 over its bound 5" in env.check_chunk(np.array([[0.0] * 6, [10.0] * 6]))
    assert Path(limits).exists()


def test_an_action_the_robot_itself_refuses_holds_the_arm_and_the_loop_goes_on(arm):
    """LeRobot's own send_action failing (its encoder, a bus error) used to end the loop with an uncaught exception,
    after which `roboloop robot` disconnected the arm (torque off). Now that tick holds and the next one asks anew."""
    robot, bus, cal = arm
    real, calls = robot.send_action, {"n": 0}

    def flaky(action):
        calls["n"] += 1
        if calls["n"] in (5, 6):  # two ticks' actions fail; the hold after the first is the second call: it fails too
            raise ConnectionError("Failed to sync write 'Goal_Position' (a bus error)")
        return real(action)

    robot.send_action = flaky
    with pytest.raises(Exception, match="refused its own present positions"):
        _drive(robot, "smooth", ticks=20)  # a robot that cannot even hold: the loop ends (RobotFault), never limp
    calls_at = {"n": 0}  # one failure this time: held, and the loop goes on

    def once(action):
        calls_at["n"] += 1
        if calls_at["n"] == 5:
            raise ConnectionError("Failed to sync write 'Goal_Position' (a bus error)")
        return real(action)

    robot.send_action = once
    loop, stats = _drive(robot, "smooth", ticks=20)
    assert stats.ticks == 20 and stats.held == 1 and stats.refused == 1, stats.summary()
    assert any("ConnectionError" in k or "Failed to sync write" in k for k in stats.reasons), stats.reasons
    _assert_safe(bus, cal)


def test_the_operators_stop_brings_the_arm_to_rest_before_letting_go(arm, tmp_path, capsys):
    """SIGTERM (a service manager, Prefect's cancel) is the operator's stop: exit 130, the arm held at its present
    position first, then disconnected as the robot's own config says (LeRobot's SO-101: torque off)."""
    import os
    import signal

    from roboloop.cli.main import main

    robot, bus, cal = arm
    robot.disconnect()
    server = HostileServer("smooth")
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    try:
        code = main(["robot", "--server", f"127.0.0.1:{server.port}", "--robot.port", bus.port, "--robot.id", "arm",
                     "--robot.calibration-dir", str(tmp_path), "--token-file", str(tmp_path / "token"), "--fps", "50",
                     "--max-steps", "1000"])
    finally:
        server.close()
    assert code == 130, capsys.readouterr().err
    goals = _goals(bus)
    assert all(g[-1] == g[-2] for g in goals.values()), goals  # at rest: the last goals repeat the present ones
    last = {}
    for motor_id, on in bus.torque_writes:
        last[motor_id] = on
    assert all(last[i] == 0 for i in range(1, 7))  # then let go as LeRobot's config asks, at rest
    _assert_safe(bus, cal, torque=False)
    assert signal.getsignal(signal.SIGTERM) == before  # the command put the caller's handler back
