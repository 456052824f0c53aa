"""`roboloop robot`'s loop over a policy server, on a simulated robot behind LeRobot's robot interface."""

from __future__ import annotations

import numpy as np
import pytest

from roboloop.evaluation.evaluator import evaluate
from roboloop.policies import load_policy
from roboloop.serving.client import PolicyClient
from roboloop.serving.robot import RobotLoop, RobotLoopConfig, io_names
from roboloop.serving.server import ServeConfig, Server
from roboloop.serving.sim_robot import SimRobot
from tests.models import untrained_model

TOKEN = "r" * 32


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    pytest.importorskip("gym_pusht")
    model = untrained_model(tmp_path_factory.mktemp("robot") / "m", 2, 2, 8, state_std=100.0, action_std=100.0,
                            cameras=("observation.image",))
    with Server(ServeConfig(str(model), port=0), TOKEN) as srv:
        yield model, srv


def _robot():
    from roboloop.sim.gym_env import GymVectorEnv

    return SimRobot(GymVectorEnv("gym_pusht/PushT-v0", num_envs=1, seed=5, max_episode_steps=24), seed=5)


def test_synchronous_robot_loop_plays_the_evaluators_episodes(served):
    model, srv = served
    robot = _robot()
    assert io_names(robot) == (["state_0", "state_1"], ["observation.image"], ["action_0", "action_1"])
    with PolicyClient(f"serve://127.0.0.1:{srv.port}", token=TOKEN) as c:
        srv.service.slot.policy.g.manual_seed(0)  # the same noise stream as the in-process policy below
        loop = RobotLoop(robot, c, RobotLoopConfig(execute_steps=4, max_steps=3 * 24, realtime=False,
                                                   instruction=robot.obs.instructions[0]))

        sent = []

        def on_tick(tick, action):
            sent.append([action["action_0"], action["action_1"]])
            if robot.episode_ended:  # a new episode: plan afresh, as the Evaluator does
                loop.reset()

        stats = loop.run(on_tick)
    robot.disconnect()
    assert stats.ticks == 72 and stats.chunks == stats.stalls == 18 and len(robot.episodes) == 3
    env = _robot().env
    report, trajs = evaluate(env, load_policy(model, seed=0), episodes=3, execute_steps=4, videos=0, seed=5,
                             record_rollouts=True)
    env.close()
    keys = ("success", "ret", "length")
    assert [{k: e[k] for k in keys} for e in report.per_episode] == robot.episodes
    # the same actions, tick by tick, as the Evaluator executed in-process
    assert np.array_equal(np.asarray(sent, np.float32), np.concatenate([np.stack(t["actions"]) for t in trajs]))
    assert len({tuple(a) for a in sent}) > 20


def test_prefetching_keeps_the_robot_moving(served):
    _, srv = served
    robot = _robot()
    with PolicyClient(f"serve://127.0.0.1:{srv.port}", token=TOKEN) as c:
        loop = RobotLoop(robot, c, RobotLoopConfig(fps=10, execute_steps=6, prefetch=4, max_steps=30))
        stats = loop.run()
    robot.disconnect()
    assert stats.ticks == 30 and stats.chunks >= 5
    # the first chunk is waited for; a prefetched one is asked for 4 ticks (400 ms) before it is needed, so only a
    # chunk slower than the 3 ticks that surely pass makes the robot wait (quiet: ~10 ms each, one stall; CI's
    # loaded machine once took 343-904 ms for three chunks: four stalls)
    slow = sum(ms > 300 for ms in stats.roundtrip_ms[1:])
    assert stats.stalls <= 1 + slow and stats.stalls < stats.chunks, stats
    assert stats.roundtrip_ms and list(stats.versions) == [srv.service.slot.version]


def test_a_robot_that_does_not_match_the_model_is_refused(served, tmp_path):
    _, srv = served
    other = untrained_model(tmp_path / "o", 6, 3, 8)
    with Server(ServeConfig(str(other), port=0), TOKEN) as s2, \
            PolicyClient(f"serve://127.0.0.1:{s2.port}", token=TOKEN) as c:
        robot = _robot()
        with pytest.raises(ValueError, match="reads a 6-dim state .* the robot has 2 joints"):
            RobotLoop(robot, c, RobotLoopConfig())
        robot.disconnect()


def test_robot_command_drives_a_simulated_robot_and_names_a_missing_arm(served, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from roboloop.serving.token import read_token

    model, _ = served
    env = {**os.environ, "ROBOLOOP_SERVE_TOKEN_FILE": str(tmp_path / "token")}
    token = read_token(tmp_path / "token", create=True)
    with Server(ServeConfig(str(model), port=0), token) as srv:
        def robot(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "roboloop.cli", "robot", "--server",
                                   f"127.0.0.1:{srv.port}", *args], capture_output=True, text=True, env=env,
                                  timeout=300)

        p = robot("--robot.type", "sim", "--task", "gym_pusht/PushT-v0", "--max-steps", "40", "--execute-steps", "4")
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert out["ticks"] == 40 and out["chunks"] >= 10 and list(out["versions"]) == [srv.service.slot.version]
        p = robot("--robot.type", "so101_follower", "--robot.port", str(tmp_path / "no-such-tty"))
        assert p.returncode != 0 and p.stderr.startswith("roboloop robot: error: Could not connect on port")
