"""The robot's envelope (roboloop.serving.envelope) as an evaluation measures it: the SO-101 task's scripted expert,
whose demonstrations the presets' policies learn, plays inside the default envelope (no refusal, the same outcomes);
a policy whose chunks jump 90 degrees every other action is refused and the report counts it, before any robot
moves (`roboloop evaluate --envelope robot`)."""

from __future__ import annotations

import numpy as np
import pytest

from roboloop.serving.envelope import Envelope, for_task

pytest.importorskip("mujoco")
TASK = "MuJoCo-SO101-PickCube-v0"


class Jumpy:
    """The expert's plan with +90 degrees on the shoulder pan every other action."""

    name = "jumpy"

    def __init__(self, expert):
        self.expert = expert
        self.whole_batch = getattr(expert, "whole_batch", False)  # the expert plans from the whole env's state

    def act(self, obs):
        c = self.expert.act(obs).clone()
        c = c[:, None].repeat(1, 4, 1) if c.ndim == 2 else c
        c[:, 1::2, 0] += 90.0
        return c


@pytest.fixture(scope="module")
def env():
    from roboloop.sim import make_env

    e = make_env(TASK, 2, "cpu", 0, camera=False)
    yield e
    e.close()


def test_the_expert_plays_inside_the_envelope_and_jumps_are_refused_and_counted(env):
    from roboloop.evaluation.evaluator import evaluate
    from roboloop.evaluation.policies import make_policy
    from roboloop.evaluation.run import action_names

    envelope = for_task(env, action_names(TASK, env.action_dim))
    assert envelope.names[0] == "shoulder_pan.pos" and envelope.on_violation == "hold"
    assert envelope.max_step[0] == 10.0 and np.isinf(envelope.max_step[5])  # the gripper: its limits alone
    expert = make_policy("expert", env, "cpu", 0)
    plain, _ = evaluate(env, expert, 8, execute_steps=4, videos=0)
    inside, _ = evaluate(env, expert, 8, execute_steps=4, videos=0, envelope=envelope)
    assert inside.envelope["refused"] == inside.envelope["clamped"] == 0
    assert [e["success"] for e in inside.per_episode] == [e["success"] for e in plain.per_episode]
    assert plain.successes >= 6
    jumpy, _ = evaluate(env, Jumpy(expert), 8, execute_steps=4, videos=0, envelope=envelope)
    assert jumpy.envelope["refused"] > 100 and jumpy.envelope["refused"] < jumpy.envelope["steps"], jumpy.envelope
    clamped, _ = evaluate(env, Jumpy(expert), 8, execute_steps=4, videos=0,
                          envelope=for_task(env, list(envelope.names), on_violation="clamp"))
    assert clamped.envelope["clamped"] > 100 and clamped.envelope["refused"] == 0


def test_admit_bounds_step_acceleration_and_first_target():
    inf = np.inf
    e = Envelope(("a.pos", "b.pos"), np.array([-90.0, -90.0]), np.array([90.0, 90.0]), np.array([10.0, inf]),
                 np.array([4.0, inf]), np.array([15.0, inf]), "clamp")
    present = np.zeros(2)
    target, why = e.admit(np.array([12.0, 50.0]), present, None, None, True)
    assert target.tolist() == [10.0, 50.0] and "a.pos 12: its step from 0 breaks the envelope" in why
    target, why = e.admit(np.array([4.0, 0.0]), present, np.zeros(2), np.zeros(2), False)
    assert why is None and target.tolist() == [4.0, 0.0]
    target, why = e.admit(np.array([9.0, 0.0]), present, np.array([4.0, 0.0]), np.zeros(2), False)
    assert why is None  # a step of 5 after one of 4: within the acceleration bound
    target, why = e.admit(np.array([-6.0, 0.0]), present, np.array([9.0, 0.0]), np.array([4.0, 0.0]), False)
    assert target[0] == 9.0 and why  # a reversal at speed: clamped to stopping where it is
    _, why = e.admit(np.array([100.0, 0.0]), present, None, None, True)
    assert why == "a.pos 100 outside its limits [-90, 90]"
    _, why = e.admit(np.array([np.nan, 0.0]), present, None, None, True)
    assert why == "a non-finite target"
    assert e.check_chunk(np.array([[0.0, 0], [20.0, 0]])) == "action 1: a.pos step 20 over its bound 10"
    assert e.check_chunk(np.array([[0.0, 0], [8.0, 0], [8.0, 0]])) == "action 2: a.pos acceleration -8 over its bound 4"


def test_roboloop_evaluate_reports_what_the_envelope_did(tmp_path):
    """The command a team runs before a robot moves: `--envelope robot` in report.json and in the summary the gate
    reads (summary.json's envelope; `gate_envelope` compares it with the champion's)."""
    import json
    import subprocess
    import sys

    out = tmp_path / "eval"
    p = subprocess.run([sys.executable, "-m", "roboloop.cli", "evaluate", "--policy", "expert", "--task", TASK,
                        "--episodes", "4", "--num-envs", "2", "--envelope", "robot", "--videos", "0", "--output-dir",
                        str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["envelope"]["refused"] == 0 and report["envelope"]["steps"] > 100
    assert "step <= 10" in report["envelope"]["envelope"]
    assert json.loads((out / "summary.json").read_text())["envelope"]["steps"] == report["envelope"]["steps"]
