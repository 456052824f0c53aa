"""What a run log shows: simulator chatter at DEBUG, errors at WARNING, roboloop's lines at INFO; run names."""

from __future__ import annotations

import logging

import pytest

from roboloop.procs import log_level

# lines an Isaac Lab evaluation on CPU prints (copied from a real run's output)
CHATTER = [
    "[INFO]: Base environment:",
    "Failed to get root com velocity. If the articulation is fixed, this is expected. Setting root com velocity to "
    "zeros.",  # isaaclab_newton's logger.warning, printed bare by Python's last-resort handler
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
    from flows import short

    assert short("registry:reach-vla@3") == "reach-vla@3"
    assert short("registry:/srv/registry#reach-vla@champion") == "reach-vla@champion"
    assert short("/data/artifacts/models/tiny-0123") == "tiny-0123"
    assert short("s3://bucket/robots/arm1") == "s3://bucket/robots/arm1"


def test_state_messages_give_the_result_a_person_scans_the_runs_list_for():
    from roboloop.loop.summary import decision_message, eval_message
    from roboloop.receipts import Decision, EvalSummary

    s = EvalSummary(run_dir="/r", report_sha256="0" * 64, policy="reach-vla@3", policy_id="w", task="t",
                    episodes=48, successes=46, success_rate=46 / 48, ci_low=0.859, ci_high=0.988, seed=1)
    assert eval_message(s) == "reach-vla@3: 46/48 = 95.8% [86, 99], seed 1"
    drop = {"success_rate": 0.5, "ci_low": 0.3, "ci_high": 0.7, "episodes": 48, "drop": 0.46, "outcomes": ""}
    same = {**drop, "success_rate": 46 / 48, "drop": 0.0}
    hit = s.model_copy(update={"perturbations": {"frame_drop": {"0.5": drop}, "obs_noise": {"0.02": same}}})
    assert eval_message(hit).endswith("; worst perturbation frame_drop=0.5: 50%")
    d = Decision(registry="r", name="reach-vla", version=4, promoted=False, reason="paired ...: worse", champion=3)
    assert decision_message(d) == "reach-vla v4: not promoted (champion stays v3); paired ...: worse"
    long = d.model_copy(update={"promoted": True, "reason": "x" * 500})
    msg = decision_message(long)
    assert msg.startswith("reach-vla v4: promoted to champion; xxx") and len(msg) == 240
