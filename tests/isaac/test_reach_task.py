"""The shipped Isaac Lab task on CPU, offline: scripted expert, random policy, collection, rollouts.

Each case runs `roboloop` in a fresh process (Isaac Lab keeps one simulation per process),
inside a network namespace with no interfaces where `unshare -n` is allowed, so the only
assets it can load are the ones the project ships.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.isaac


def _offline_prefix() -> list[str]:
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n"]
    return []


def roboloop(*args: str, timeout: int = 900) -> dict:
    env = {**os.environ, "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
           "OMP_NUM_THREADS": "2"}
    env.pop("ISAACSIM_ASSET_ROOT", None)  # roboloop must point Isaac Lab at its own assets
    proc = subprocess.run([*_offline_prefix(), sys.executable, "-m", "roboloop.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_expert_succeeds_offline_on_cpu_with_shipped_assets(tmp_path):
    r = roboloop("evaluate", "--policy", "expert", "--episodes", "48", "--num-envs", "16",
                 "--output-dir", str(tmp_path))
    assert r["episodes"] == 48 and r["backend"] == "isaaclab-newton_mjwarp-cpu+graph"  # tests/isaac/test_cpu_graph.py
    assert r["success_rate"] >= 0.95, r
    assert "Isaac/IsaacLab/Robots/Roboloop/ReachArm/reach_arm.usda" in r["asset_hashes"]
    assert len(r["videos"]) == 2 and all(os.path.getsize(v) > 0 for v in r["videos"])
    assert (tmp_path / "eval.png").exists() and (tmp_path / "report.json").exists()


def test_random_policy_far_below_expert(tmp_path):
    r = roboloop("evaluate", "--policy", "random", "--episodes", "32", "--num-envs", "16", "--videos", "0",
                 "--output-dir", str(tmp_path))
    assert r["success_rate"] <= 0.2, r


def test_collect_writes_valid_v21_and_rollouts_save_as_v3(tmp_path):
    import numpy as np

    from roboloop.datasets.meta import load_meta
    from roboloop.datasets.validate import validate
    from roboloop.datasets.video import decode_frames_at

    r = roboloop("collect", str(tmp_path / "demos"), "--episodes", "8", "--num-envs", "8")
    assert r["expert_success_rate"] >= 0.75
    report = validate(tmp_path / "demos")
    assert report.ok, report.human()
    meta = load_meta(tmp_path / "demos")
    assert list(meta.info.features["observation.images.top"].shape) == [64, 64, 3]
    assert any("reach the" in t for t in meta.tasks.values())
    # Every recorded frame is that step's render: the camera buffer is rewritten in place, and frames kept by
    # reference once made every frame of an episode the same picture.
    longest = max(meta.episodes, key=lambda e: e.length)
    video = tmp_path / "demos" / meta.info.video_path.format(episode_chunk=0, video_key="observation.images.top",
                                                             episode_index=longest.episode_index)
    frames = decode_frames_at(video, [0.0, (longest.length - 1) / meta.info.fps], tolerance_s=0.02)
    assert np.abs(frames[0].astype(float) - frames[-1].astype(float)).mean() > 0.2, "first and last frame equal"
    ev = roboloop("evaluate", "--policy", "expert", "--episodes", "4", "--num-envs", "4", "--videos", "0",
                  "--output-dir", str(tmp_path / "ev"), "--save-rollouts", str(tmp_path / "rollouts"))
    v3 = load_meta(ev["rollouts"])
    assert v3.version == "v3.0" and v3.info.total_episodes == 4


# The policy `make demo` trains is held to its bar (Wilson lower bound >= 0.7 on held-out layouts) by
# tests/e2e/test_fresh_clone.py, which runs the README's `make demo` itself on a fresh clone.
