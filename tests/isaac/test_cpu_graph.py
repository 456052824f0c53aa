"""The physics step replayed as a Warp graph on the CPU (roboloop/sim/cpu_graph.py) changes nothing but the
speed: the same episodes as Isaac Lab's own eager CPU step, bit for bit, on the reach task, on the SO-101 pick
(contacts: the jaws closing on the cube and lifting it) and for a model acting on a camera's pictures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.models import untrained_model

pytestmark = pytest.mark.isaac
SO101 = "Roboloop-SO101-PickCube-v0"


def _evaluate(tmp_path, name: str, graph: str, policy: str, task: str, episodes: int) -> dict:
    out = tmp_path / f"{name}-{graph}"
    env = {**os.environ, "ROBOLOOP_CPU_GRAPH": graph, "ROBOLOOP_CACHE_DIR": str(tmp_path / "cache")}
    p = subprocess.run([sys.executable, "-m", "roboloop.cli", "evaluate", "--policy", policy, "--task", task,
                        "--episodes", str(episodes), "--num-envs", str(episodes), "--videos", "0",
                        "--output-dir", str(out)], capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


def _episodes(report: dict) -> list[tuple]:
    return [(e["index"], e["success"], e["length"], e["ret"]) for e in sorted(report["per_episode"],
                                                                               key=lambda e: e["index"])]


@pytest.mark.parametrize("name, task, policy, episodes, cameras", [
    ("reach-random", "Roboloop-Reach-Color-v0", "random", 3, ()),  # every episode to its time limit
    ("so101-expert", SO101, "expert", 4, ()),  # the grasp and lift: contacts
    # a model that acts on the camera's pictures of the scene the replayed steps left behind
    ("vision-vla", "Roboloop-Reach-Color-Vision-v0", "model", 2, ("observation.images.top",))])
def test_replayed_steps_give_the_eager_steps_episodes_bit_for_bit(tmp_path, name, task, policy, episodes, cameras):
    if policy == "model":
        from tests.isaac.test_serve_reach import _dims

        policy = str(untrained_model(tmp_path / "m", *_dims(task), 8, cameras=cameras, seed=3))
    eager = _evaluate(tmp_path, name, "0", policy, task, episodes)
    graph = _evaluate(tmp_path, name, "1", policy, task, episodes)
    assert eager["backend"] == "isaaclab-newton_mjwarp-cpu" and graph["backend"] == eager["backend"] + "+graph"
    assert _episodes(graph) == _episodes(eager)
    assert graph["initial_states"] == eager["initial_states"]
    if policy == "expert":
        assert graph["successes"] >= 3, graph  # it grasped and lifted: contacts went through the replays


def test_a_setting_other_than_0_or_1_is_refused(monkeypatch):
    from roboloop.sim import cpu_graph

    monkeypatch.setenv("ROBOLOOP_CPU_GRAPH", "yes")
    with pytest.raises(ValueError, match="ROBOLOOP_CPU_GRAPH='yes'"):
        cpu_graph.wanted()
