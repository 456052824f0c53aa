"""RL configuration and run folders: validation, resume checks, never writing into a folder that is not ours."""

from __future__ import annotations

import pytest

from roboloop.rl.config import RLConfig


def _cfg(model, out, env_steps):
    return RLConfig(policy=str(model), output_dir=str(out), env_steps=env_steps)


def test_cuda_devices_reserve_gpus_and_std_bounds_are_checked():
    c = RLConfig(policy="m", learner_device="cuda")
    assert c.learner_gpus == 1.0 and c.rollout_gpus == 0.0
    with pytest.raises(ValueError, match="min_std"):
        RLConfig(policy="m", min_std=0.5, max_std=0.1)


def test_progress_lines_are_readable():
    from roboloop.rl.run import progress_line

    ev = {"version": 3, "env_steps": 3072, "rollout_success": 0.5, "approx_kl": 0.012, "staleness_max": 1,
          "noise_std": 0.1, "critic_only": False}
    assert progress_line(ev) == ("rl: update 3, 3072 env steps, rollout success 50%, kl 0.012, staleness 1, "
                                 "noise 0.100")


def test_a_foreign_output_folder_is_refused(tmp_path):
    from roboloop.errors import RoboloopError
    from roboloop.rl.run import _claim

    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("keep me")
    with pytest.raises(RoboloopError, match="not an RL run"):
        _claim(_cfg(tmp_path / "m", user, 10), user)
    assert (user / "notes.txt").read_text() == "keep me" and len(list(user.iterdir())) == 1
    run = tmp_path / "run"
    assert _claim(_cfg(tmp_path / "m", run, 10), run) is None
    other = _cfg(tmp_path / "m", run, 10).model_copy(update={"lr": 1e-3})
    with pytest.raises(RoboloopError, match="different lr"):
        _claim(other, run)


def test_reward_and_discount_resolve_per_task():
    from roboloop.errors import RoboloopError
    from roboloop.rl.config import reward_mode

    reach = RLConfig(policy="m")  # Roboloop-Reach-Color-v0, reward auto: progress with a short horizon
    assert reward_mode(reach.task, reach.reward) == "progress" and reach.gamma == 0.5
    other = RLConfig(policy="m", task="Isaac-Cartpole-Direct-v0")
    assert reward_mode(other.task, other.reward) == "task" and other.gamma == 0.99
    assert RLConfig(policy="m", reward="task").gamma == 0.99
    assert RLConfig(policy="m", reward="task", gamma=0.9).discount() == 0.9
    with pytest.raises(RoboloopError, match="Isaac-Cartpole-Direct-v0 has no progress reward"):
        reward_mode("Isaac-Cartpole-Direct-v0", "progress")
