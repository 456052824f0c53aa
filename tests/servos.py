"""Feetech STS3215 servos behind a serial port, byte for byte: LeRobot's `SOFollower` (its `FeetechMotorsBus`, the
`scservo_sdk` packet handler and its group sync reads and writes) runs unchanged and only pyserial's port is
replaced. Each servo has the STS control table's memory; a goal it is sent becomes its present position (an ideal
servo) while its torque is on, and every goal is recorded in raw servo units, so a test sees what a real arm's
motors would have been told.

    with servo_bus(calibration) as bus:        # patches serial.Serial for the port name it returns
        robot = SO101Follower(SO101FollowerConfig(port=bus.port, id="arm", calibration_dir=...))
        robot.connect()
        ... bus.goals  # [(motor id, raw goal), ...] in the order they were written
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

PING, READ, WRITE, SYNC_READ, SYNC_WRITE = 0x01, 0x02, 0x03, 0x82, 0x83
BROADCAST = 0xFE
ADDR_MODEL, ADDR_MIN, ADDR_MAX, ADDR_OFFSET = 3, 9, 11, 31
ADDR_TORQUE, ADDR_GOAL, ADDR_PRESENT = 40, 42, 56
MOTORS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")


def _checksum(body: list[int]) -> int:
    return ~sum(body) & 0xFF


def _signed(value: int, bit: int) -> int:
    """LeRobot's sign-magnitude encoding (Goal_Position's sign bit is 15) back to an int."""
    return -(value & ((1 << bit) - 1)) if value >> bit & 1 else value


@dataclass
class Servo:
    id: int
    memory: bytearray = field(default_factory=lambda: bytearray(256))

    def word(self, addr: int) -> int:
        return self.memory[addr] | self.memory[addr + 1] << 8

    def set_word(self, addr: int, value: int) -> None:
        self.memory[addr], self.memory[addr + 1] = value & 0xFF, value >> 8 & 0xFF


class ServoBus:
    """The serial port object pyserial would have returned: `write` takes instruction packets, `read` gives status
    packets."""

    def __init__(self, port: str, calibration: dict[str, dict]):
        self.port, self.rx = port, bytearray()
        self.servos: dict[int, Servo] = {}
        self.goals: list[tuple[int, int]] = []  # (motor id, raw goal) as written, sign-decoded
        self.torque_writes: list[tuple[int, int]] = []
        for name in MOTORS:
            cal = calibration[name]
            s = Servo(cal["id"])
            s.memory[0], s.memory[1] = 3, 10  # firmware 3.10 on every servo
            s.set_word(ADDR_MODEL, 777)  # the STS3215's model number
            s.set_word(ADDR_MIN, cal["range_min"])
            s.set_word(ADDR_MAX, cal["range_max"])
            off = cal["homing_offset"]
            s.set_word(ADDR_OFFSET, -off | 1 << 11 if off < 0 else off)
            s.set_word(ADDR_PRESENT, (cal["range_min"] + cal["range_max"]) // 2)
            self.servos[s.id] = s
        self.is_open, self.timeout = True, 0

    # pyserial's interface, as scservo_sdk's PortHandler uses it
    def write(self, data) -> int:
        packet = list(data)
        self._handle(packet)
        return len(packet)

    def read(self, n: int) -> bytes:
        out, self.rx = bytes(self.rx[:n]), self.rx[n:]
        return out

    @property
    def in_waiting(self) -> int:
        return len(self.rx)

    def flush(self) -> None:
        pass

    def reset_input_buffer(self) -> None:
        self.rx.clear()

    def close(self) -> None:
        self.is_open = False

    def torque(self, motor_id: int) -> int:
        return self.servos[motor_id].memory[ADDR_TORQUE]

    def _status(self, sid: int, params: list[int]) -> None:
        body = [sid, len(params) + 2, 0, *params]
        self.rx += bytes([0xFF, 0xFF, *body, _checksum(body)])

    def _write(self, servo: Servo, addr: int, data: list[int]) -> None:
        servo.memory[addr:addr + len(data)] = bytes(data)
        if addr <= ADDR_GOAL < addr + len(data):
            goal = _signed(servo.word(ADDR_GOAL), 15)
            self.goals.append((servo.id, goal))
            if servo.memory[ADDR_TORQUE]:
                servo.set_word(ADDR_PRESENT, max(0, min(4095, goal)))
        if addr <= ADDR_TORQUE < addr + len(data):
            self.torque_writes.append((servo.id, servo.memory[ADDR_TORQUE]))

    def _handle(self, p: list[int]) -> None:
        assert p[:2] == [0xFF, 0xFF] and _checksum(p[2:-1]) == p[-1], f"a malformed packet {p}"
        sid, inst, params = p[2], p[4], p[5:-1]
        if inst == PING:
            for s in self.servos.values() if sid == BROADCAST else [self.servos.get(sid)]:
                if s is not None:
                    self._status(s.id, [])
        elif inst == READ and sid in self.servos:
            addr, n = params
            self._status(sid, list(self.servos[sid].memory[addr:addr + n]))
        elif inst == WRITE and sid in self.servos:
            self._write(self.servos[sid], params[0], params[1:])
            self._status(sid, [])
        elif inst == SYNC_READ:
            addr, n = params[:2]
            for i in params[2:]:
                self._status(i, list(self.servos[i].memory[addr:addr + n]))
        elif inst == SYNC_WRITE:
            addr, n = params[:2]
            rest = params[2:]
            for k in range(0, len(rest), n + 1):
                self._write(self.servos[rest[k]], addr, rest[k + 1:k + 1 + n])


def calibration(range_min: int = 1024, range_max: int = 3072) -> dict[str, dict]:
    """A calibration as LeRobot's calibration file holds it: every joint's range `range_min..range_max` (raw), the
    wrist roll's whole turn, the gripper's own range."""
    cal = {}
    for i, name in enumerate(MOTORS, start=1):
        lo, hi = (0, 4095) if name == "wrist_roll" else (2000, 3400) if name == "gripper" else (range_min, range_max)
        cal[name] = {"id": i, "drive_mode": 0, "homing_offset": 0, "range_min": lo, "range_max": hi}
    return cal


@contextlib.contextmanager
def servo_bus(cal: dict[str, dict], port: str = "/dev/roboloop-test-servos"):
    """A ServoBus that `serial.Serial(port=...)` returns while the context is open (scservo_sdk's PortHandler
    creates its port through it)."""
    import types

    import scservo_sdk.port_handler as ph

    bus = ServoBus(port, cal)
    real = ph.serial

    def serial(*args, **kwargs):
        if kwargs.get("port") == port:
            bus.is_open = True
            return bus
        return real.Serial(*args, **kwargs)

    ph.serial = types.SimpleNamespace(Serial=serial, EIGHTBITS=real.EIGHTBITS)
    try:
        yield bus
    finally:
        ph.serial = real
