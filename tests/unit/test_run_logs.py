"""What a run log shows: simulator chatter at DEBUG, errors at WARNING, roboloop's lines at INFO; run names."""

from __future__ import annotations

import logging

import pytest

from roboloop.procs import log_level

# lines an Isaac Lab evaluation on CPU prints (copied from a real run's output)
CHATTER = [
    "[INFO]: Base environment:",
    "\tEnvironment device    : cpu",
    "Finalize builder took: Last: 0.030187 s, Mean: 0.030187 s, Std: 0.000000 s, N: 1",
    "Warp CUDA warning: Could not find or load the NVIDIA CUDA driver. GPU execution will not be available.",
    "2026-11-23 20:56:04,053 INFO isaaclab.sensors.camera.camera: Using renderer: NewtonWarpRenderer",
    "/x/isaaclab_newton/cloner/newton_clone_utils.py:165: FutureWarning: Newton shape color replacement is enabled",
    "  replace_newton_builder_shape_colors(builder, stage)",
    "Warning: The rigid body at /World/envs/env_0/red_ball has a possibly invalid inertia tensor of {1.0, 1.0, 1.0}",
    '{"task": "Roboloop-Reach-Color-v0", "episodes": 4, "successes": 4}',
]


@pytest.mark.parametrize("line", CHATTER)
def test_simulator_chatter_is_debug(line):
    assert log_level(line) == logging.DEBUG


@pytest.mark.parametrize("line", ["Traceback (most recent call last):", "RuntimeError: CUDA out of memory",
                                  "2026-11-23 20:56:04,781 ERROR isaaclab.sim: physics diverged"])
def test_errors_stay_visible(line):
    assert log_level(line) == logging.WARNING


def test_roboloop_lines_are_info():
    assert log_level("$ /x/python -m roboloop.entry evaluate /tmp/cfg.json") == logging.INFO
    assert log_level("step 200/1200 loss 0.2154 lr 9.6e-04") == logging.INFO


def test_progress_lines_every_eighth_and_the_last():
    from roboloop.evaluation.evaluator import progress_printer

    lines: list[str] = []
    show = progress_printer("evaluating", out=lines.append)
    succ = 0
    for done in range(1, 49):
        succ += done % 3 != 0
        show(done, succ, 48)
    assert len(lines) == 8 and lines[-1] == "evaluating: 48/48 episodes, 32 successes (66.7%)"


def test_run_names_from_parameters():
    from flows import _short

    assert _short("registry:reach-vla@3") == "reach-vla@3"
    assert _short("registry:/srv/registry#reach-vla@champion") == "reach-vla@champion"
    assert _short("/data/artifacts/models/tiny-0123") == "tiny-0123"
    assert _short("s3://bucket/robots/arm1") == "s3://bucket/robots/arm1"
