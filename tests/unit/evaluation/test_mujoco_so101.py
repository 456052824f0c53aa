"""The MuJoCo SO-101 adapter's own parts, without Isaac Lab: units, cameras, scenes."""

from __future__ import annotations

import numpy as np
import pytest

from roboloop.sim import mujoco_so101 as M


def test_lerobot_units_round_trip_and_the_jaw_range_maps_to_0_100():
    q = np.array([0.3, -1.2, 0.5, 1.5, -2.0, np.deg2rad(-10.0)])
    assert np.allclose(M.from_lerobot(M.to_lerobot(q)), q)
    assert M.to_lerobot(q)[5] == pytest.approx(0.0)
    assert M.to_lerobot(np.array([0, 0, 0, 0, 0, np.deg2rad(100.0)]))[5] == pytest.approx(100.0)


def test_the_cameras_sit_where_the_isaac_task_puts_them_and_the_front_one_looks_at_its_target():
    import mujoco

    m = M.build_model("matched")
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    cam = m.camera("front_cam").id
    assert np.allclose(d.cam_xpos[cam], M.FRONT_EYE)
    view = -d.cam_xmat[cam].reshape(3, 3)[:, 2]  # a MuJoCo camera looks along its -z
    to_target = np.subtract(M.FRONT_TARGET, M.FRONT_EYE)
    assert np.allclose(view, to_target / np.linalg.norm(to_target), atol=1e-6)
    assert m.cam_fovy[cam] == pytest.approx(58.6, abs=0.1)  # 14 mm over a 15.7 mm vertical aperture
    assert m.body(m.cam_bodyid[m.camera("wrist_cam").id]).name == "gripper"
    assert m.opt.timestep * M.SUBSTEPS == pytest.approx(1 / M.FPS)


def test_scenes_differ_only_where_they_say_and_an_unknown_one_is_refused():
    matched, shipped = M.build_model("matched"), M.build_model("shipped")
    block = matched.body("block").id
    assert matched.body_mass[block] == pytest.approx(0.03) and shipped.body_mass[block] == pytest.approx(0.1)
    assert np.allclose(matched.geom_size[matched.geom("block").id], 0.02)
    for m in (matched, shipped):  # the jaws touch through their pads in both
        assert m.geom_contype[m.geom("fixed_jaw_pad").id] == 1
    with pytest.raises(ValueError, match="scene must be matched or shipped"):
        M.build_model("studio")


def test_renderer_factors_re_render_the_cameras_and_the_light_per_episode_and_restore_them():
    import torch

    env = M.MujocoSO101Env(2, seed=0)
    try:
        nominal = env.reset().images
        shown = {}
        for factor, level in (("camera_pose", 4), ("camera_fov", 1.25), ("lighting", 0.5)):
            env.perturb_scene(factor, level, seed=0)
            shown[factor] = env.reset().images
            again = env.reset().images  # a pure function of (seed, factor, level, episode)
            assert all(torch.equal(shown[factor][k], again[k]) for k in nominal)
            for k in nominal:  # both cameras, every env: another picture of the same scene
                assert all(not torch.equal(a, b) for a, b in zip(shown[factor][k], nominal[k], strict=True)), factor
        env.perturb_scene(None)
        restored = env.reset().images
        assert all(torch.equal(restored[k], nominal[k]) for k in nominal)
        front = "observation.images.front"
        assert shown["lighting"][front].float().mean() < nominal[front].float().mean() - 10  # half the light
        with pytest.raises(ValueError, match="cannot apply frame_drop"):
            env.perturb_scene("frame_drop", 0.5)
    finally:
        env.close()
