"""Perturbation factors and latency charged in simulated time, on small envs whose every step is known: what each
factor does to what the policy sees or the robot does, that its draws depend on the episode and not on how many envs
ran, and that a chunk asked for at step t acts from step t + d on, its stale actions skipped, the arm holding until
the episode's first chunk arrives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roboloop.evaluation import perturb
from roboloop.evaluation.evaluator import evaluate
from roboloop.sim.protocol import Obs, StepResult


class CountingEnv:
    """Env i's k-th episode lasts `length` steps and succeeds; the state is (episode number, step), the camera's
    pixel (0, 0) holds the step, the rest of the image a gradient; executed actions are kept."""

    backend, task, fps, action_dim = "counting", "counting", 10, 2

    def __init__(self, num_envs: int, length: int = 6):
        self.num_envs, self.length = num_envs, length
        self.action_low, self.action_high = -torch.ones(2), torch.ones(2)
        self.executed: list[torch.Tensor] = []

    def _obs(self) -> Obs:
        img = torch.arange(16 * 16 * 3, dtype=torch.int64).reshape(16, 16, 3) % 200
        images = img[None].repeat(self.num_envs, 1, 1, 1).to(torch.uint8)
        images[:, 0, 0, 0] = torch.as_tensor(self.t, dtype=torch.uint8)
        state = torch.tensor(np.stack([self.number, self.t], 1), dtype=torch.float32)
        return Obs(state, {"cam": images}, ["go"] * self.num_envs)

    def reset(self, seed: int | None = None) -> Obs:
        self.number, self.t, self.started = np.arange(self.num_envs), np.zeros(self.num_envs, dtype=int), self.num_envs
        return self._obs()

    def step(self, actions: torch.Tensor) -> StepResult:
        self.executed.append(actions.clone())
        self.t += 1
        done = self.t >= self.length
        for i in np.nonzero(done)[0]:
            self.number[i], self.started, self.t[i] = self.started, self.started + 1, 0
        d = torch.from_numpy(done)
        return StepResult(self._obs(), torch.zeros(self.num_envs), d, d.clone())

    def expert(self, obs: Obs) -> None:
        return None

    def hold_action(self, obs: Obs) -> torch.Tensor:
        return torch.full((obs.state.shape[0], 2), -0.5)

    def close(self) -> None:
        pass


def _noise_by_episode(num_envs: int, factor: str, level: float,
                      share: float = 1.0) -> dict[tuple[int, int], torch.Tensor]:
    env = perturb.Perturbed(CountingEnv(num_envs), factor, level, seed=3, share=share)
    clean = CountingEnv(num_envs)
    seen, obs, ref = {}, env.reset(seed=0), clean.reset(seed=0)
    for _ in range(20):
        for i in range(num_envs):
            seen[(int(ref.state[i, 0]), int(ref.state[i, 1]))] = obs.state[i] - ref.state[i]
        zero = torch.zeros(num_envs, 2)
        obs, ref = env.step(zero).obs, clean.step(zero).obs
    return seen


def test_a_factors_draws_follow_the_episode_not_the_number_of_envs():
    two, five = _noise_by_episode(2, "obs_noise", 0.05), _noise_by_episode(5, "obs_noise", 0.05)
    common = set(two) & set(five)
    assert len(common) >= 12
    assert all(torch.equal(two[k], five[k]) for k in common)
    assert 0.02 < torch.stack(list(two.values())).std().item() < 0.08  # the level is the noise's std
    other = _noise_by_episode(2, "obs_noise", 0.02)
    assert not torch.equal(two[(0, 0)], other[(0, 0)])


def test_image_factors_show_what_they_name():
    def frames(factor, level, steps=5):
        env = perturb.Perturbed(CountingEnv(1, length=50), factor, level, seed=0)
        out = [env.reset(seed=0).images["cam"][0]]
        for _ in range(steps):
            out.append(env.step(torch.zeros(1, 2)).obs.images["cam"][0])
        return out

    clean = frames("brightness", 1.0)
    delayed = frames("frame_delay", 2)
    assert [int(f[0, 0, 0]) for f in delayed] == [0, 0, 0, 1, 2, 3]  # two steps late, the first frame held
    dropped = frames("frame_drop", 0.5, steps=60)
    repeats = sum(torch.equal(a, b) for a, b in zip(dropped, dropped[1:], strict=False)) / 60
    assert 0.3 < repeats < 0.7
    shifted = frames("camera_shift", 4)[1]
    moved = [(dy, dx) for dy in range(-4, 5) for dx in range(-4, 5)
             if torch.equal(shifted[5:11, 5:11], clean[1][5 - dy:11 - dy, 5 - dx:11 - dx])]
    assert len(moved) == 1 and max(abs(moved[0][0]), abs(moved[0][1])) >= 2, moved  # one shift, ~4 px
    dark = frames("brightness", 0.5)[1]
    assert torch.equal(dark, (clean[1].float() * 0.5).to(torch.uint8))


def test_action_factors_change_what_the_robot_does():
    env = perturb.Perturbed(CountingEnv(3), "actuator_gain", 0.6, seed=0)
    env.reset(seed=0)
    env.step(torch.full((3, 2), 0.5))
    assert torch.allclose(env.env.executed[-1], torch.full((3, 2), 0.3))
    noisy = perturb.Perturbed(CountingEnv(3), "action_noise", 0.3, seed=0)
    noisy.reset(seed=0)
    noisy.step(torch.zeros(3, 2))
    a = noisy.env.executed[-1]
    assert a.abs().max() <= 1 and 0 < a.std() < 1 and not torch.equal(a[0], a[1])


def test_parse_names_factors_and_levels_and_refuses_the_unknown():
    assert perturb.parse("obs_noise=0.02,frame_drop") == [("obs_noise", 0.02), ("frame_drop", 0.1),
                                                          ("frame_drop", 0.3), ("frame_drop", 0.5)]
    assert len(perturb.parse("all")) == sum(len(f.levels) for f in perturb.FACTORS.values())
    with pytest.raises(ValueError, match="unknown factor 'fog'"):
        perturb.parse("fog=1")
    with pytest.raises(ValueError, match="must be a number"):
        perturb.parse("obs_noise=high")


def test_a_suite_that_moves_a_camera_needs_an_env_that_renders():
    # the scripted baselines run without cameras (faster) unless a suite names a factor applied by the renderer
    assert perturb.renders("camera_pose=2") and perturb.renders("obs_noise,camera_fov") and perturb.renders("all")
    assert not perturb.renders("obs_noise,camera_shift,brightness,object_pose") and not perturb.renders(None)


class ChunkPolicy:
    """Chunk j of a call holds (call number, j) in every action dimension, scaled to stay within [-1, 1]."""

    name = "chunks"

    def __init__(self, horizon: int = 8):
        self.calls, self.horizon = 0, horizon

    def act(self, obs: Obs) -> torch.Tensor:
        self.calls += 1
        n = obs.state.shape[0]
        j = torch.arange(self.horizon, dtype=torch.float32)
        chunk = (self.calls * 10 + j) / 100
        return chunk[None, :, None].expand(n, self.horizon, 2).clone()


def test_latency_runs_the_old_chunk_or_holds_then_the_new_chunk_from_its_action_d():
    env = CountingEnv(1, length=12)
    evaluate(env, ChunkPolicy(), episodes=1, execute_steps=4, videos=0, delay_steps=2)
    got = [round(float(a[0, 0]) * 100) for a in env.executed]
    # call 1 at step 0 arrives at step 2 (the arm holds: -50), acts from its action 2 for 4 steps; call 2, asked at
    # step 6, arrives at 8: meanwhile call 1 goes on (actions 6, 7)
    assert got[:12] == [-50, -50, 12, 13, 14, 15, 16, 17, 22, 23, 24, 25], got
    env0 = CountingEnv(1, length=12)
    evaluate(env0, ChunkPolicy(), episodes=1, execute_steps=4, videos=0)
    assert [round(float(a[0, 0]) * 100) for a in env0.executed] == [10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33]


def test_with_prefetch_the_next_chunk_is_asked_for_before_the_executing_one_runs_out():
    env = CountingEnv(1, length=12)
    evaluate(env, ChunkPolicy(), episodes=1, execute_steps=4, videos=0, delay_steps=2, prefetch=2)
    got = [round(float(a[0, 0]) * 100) for a in env.executed]
    # call 1 at step 0 arrives at step 2 (the arm holds), acts from its action 2; with 2 of its 4 actions left (step
    # 4) call 2 is asked for, and arrives at step 6 as call 1's last planned action ends: no stale action is run
    assert got[:12] == [-50, -50, 12, 13, 14, 15, 22, 23, 24, 25, 32, 33], got
    # as robot.py: without latency, prefetch re-plans that many actions early
    env0 = CountingEnv(1, length=12)
    evaluate(env0, ChunkPolicy(), episodes=1, execute_steps=4, videos=0, prefetch=1)
    assert [round(float(a[0, 0]) * 100) for a in env0.executed] == [10, 11, 12, 20, 21, 22, 30, 31, 32, 40, 41, 42]
    with pytest.raises(ValueError, match="prefetch 4: ask for the next chunk with 0 to 3 actions left"):
        evaluate(CountingEnv(1), ChunkPolicy(), episodes=1, execute_steps=4, videos=0, prefetch=4)


def test_summary_pairs_each_factor_with_the_nominal_episodes():
    nominal = [{"index": i, "success": i < 8} for i in range(10)]
    worse = [{"index": i, "success": i < 4 or i == 9} for i in range(10)]
    out = perturb.summarise(nominal, {("frame_drop", 0.5): worse, ("obs_noise", 0.02): nominal})
    cell = out["frame_drop"]["0.5"]
    assert cell["success_rate"] == 0.5 and cell["drop"] == pytest.approx(0.3)
    assert (cell["lost"], cell["gained"]) == (4, 1) and cell["ci_low"] < 0.5 < cell["ci_high"]
    assert out["obs_noise"]["0.02"]["drop"] == 0 and perturb.worst(out) == ("frame_drop", "0.5")


class TalkingEnv(CountingEnv):
    """CountingEnv whose episode k is told to reach the ball of colour k % 3."""

    def _obs(self) -> Obs:
        o = super()._obs()
        said = [f"reach the {('red', 'green', 'blue')[n % 3]} ball" for n in self.number]
        return Obs(o.state, o.images, said)


def _said(num_envs: int, level: float) -> dict[int, set[str]]:
    """Episode number -> the instructions the policy was given over its steps."""
    env = perturb.Perturbed(TalkingEnv(num_envs), "instruction", level, seed=5)
    obs, out = env.reset(), {}
    for _ in range(6 * 8 // num_envs):
        for i, text in enumerate(obs.instructions):
            out.setdefault(int(obs.state[i, 0]), set()).add(text)
        obs = env.step(torch.zeros(num_envs, 2)).obs
    return {k: v for k, v in out.items() if k < 8}


@pytest.mark.parametrize("level", [1, 2])
def test_instructions_are_reworded_per_episode_keeping_the_goal(level):
    one, three = _said(1, level), _said(3, level)
    assert one == three and all(len(v) == 1 for v in one.values()), (one, three)  # one wording an episode, any envs
    said = {k: next(iter(v)) for k, v in one.items()}
    for k, text in said.items():
        colour = ("red", "green", "blue")[k % 3]
        assert f"the {colour} " in text and not text.startswith("reach "), text
        assert (" ball" in text) == (level == 1), text  # level 2 names the ball another way
    assert len({t.split(" the ")[0] for t in said.values()}) >= 2, said  # episodes are told differently


def test_scene_factors_move_the_object_and_the_arm_past_the_training_range_the_same_way_every_time():
    import math

    from roboloop.sim.isaac_tasks import scenes

    balls = torch.tensor([[0.3, 0.1], [0.2, -0.25], [0.35, 0.3]])
    q = torch.tensor([0.2, 0.9])
    for level in perturb.FACTORS["object_pose"].levels:
        for episode in range(20):
            rng = perturb.draw(3, "object_pose", level, episode, -2)
            moved, q2 = scenes.reach("object_pose", level, rng, balls, 1, q, 0.14)
            bearing = abs(math.atan2(float(moved[1, 1]), float(moved[1, 0])))
            assert math.pi / 2 < bearing <= math.pi / 2 * (1 + level) + 1e-6, (level, bearing)
            assert torch.linalg.norm(moved[1]) == pytest.approx(float(torch.linalg.norm(balls[1])), abs=1e-6)
            assert torch.equal(moved[[0, 2]], balls[[0, 2]]) and torch.equal(q2, q)
            assert torch.cdist(moved[1:2], moved[[0, 2]]).min() >= 0.14
            again, _ = scenes.reach("object_pose", level, perturb.draw(3, "object_pose", level, episode, -2),
                                    balls, 1, q, 0.14)
            assert torch.equal(again, moved)  # a pure function of (seed, factor, level, episode)
        _, arm = scenes.reach("arm_pose", level, perturb.draw(3, "arm_pose", level, 0, -2), balls, 1, q, 0.14)
        assert 0.6 < abs(float(arm[0])) <= 0.6 * (1 + level) + 1e-6 and float(arm[1]) == pytest.approx(0.9)
    cube, home = torch.tensor([0.2, 0.0, 0.02, 0.1]), torch.zeros(6)
    spread = torch.tensor([0.2, 0.1, 0.1, 0.1, 0.2, 0.0])
    c2, _ = scenes.so101("object_pose", 0.5, perturb.draw(0, "object_pose", 0.5, 4, -2), cube, home, (-0.6, 0.6),
                         spread, home, 0.5)
    assert 0.6 < abs(math.atan2(float(c2[1]), float(c2[0]))) <= 0.9 + 1e-6 and float(c2[2]) == pytest.approx(0.02)
    _, q3 = scenes.so101("arm_pose", 1.0, perturb.draw(0, "arm_pose", 1.0, 4, -2), cube, home, (-0.6, 0.6),
                         spread, home, 0.5)
    assert all(s < abs(float(v)) <= 2 * s + 1e-6 for v, s in zip(q3[:5], spread[:5], strict=True))
    assert float(q3[5]) == 0.0  # the gripper starts as it always does


def test_a_share_of_the_episodes_meets_the_factor_drawn_per_episode_and_a_recording_takes_one_factor():
    from pydantic import ValidationError

    from roboloop.evaluation.config import CollectConfig

    two, five = _noise_by_episode(2, "obs_noise", 0.05, 0.5), _noise_by_episode(5, "obs_noise", 0.05, 0.5)
    assert all(torch.equal(two[k], five[k]) for k in set(two) & set(five))  # per episode, whatever num_envs
    noisy = {}
    for (episode, _step), delta in five.items():
        noisy.setdefault(episode, set()).add(bool(delta.abs().sum() > 0))
    assert all(len(v) == 1 for v in noisy.values()), noisy  # an episode meets it at every step or at none
    met = sum(v == {True} for v in noisy.values())
    assert 0 < met < len(noisy), noisy  # some episodes do, some do not (6 of 20 here)
    with pytest.raises(ValueError, match="object_pose lays out every episode the task resets; a share of them"):
        perturb.Perturbed(CountingEnv(2), "object_pose", 0.5, seed=0, share=0.5)
    assert CollectConfig(perturb="instruction=2", perturb_share=0.5).perturb == "instruction=2"
    for bad, said in (({"perturb": "instruction"}, "a recording meets one factor at one level"),
                      ({"perturb": "obs_noise=0.01,frame_drop=0.1"}, "one factor at one level"),
                      ({"perturb_share": 0.5}, "perturb_share would do nothing")):
        with pytest.raises(ValidationError, match=said):
            CollectConfig(**bad)


def test_the_so101_dressing_puts_distractors_where_a_cube_could_be_and_turns_the_cubes_colour_nothing_else():
    from roboloop.sim.isaac_tasks import scenes

    for level in perturb.FACTORS["distractors"].levels:
        for episode in range(40):
            cube, q = scenes.so101_layout("test", 0, episode, ("distractors", level, 5))
            assert torch.equal(cube, scenes.so101_layout("test", 0, episode)[0])  # the layout is nominal's
            placed, hue = scenes.so101_dressing(("distractors", level, 5), episode, cube)
            assert placed.shape == (level, 3) and hue == 0.0
            r, bearing = torch.linalg.norm(placed[:, :2], dim=-1), torch.atan2(placed[:, 1], placed[:, 0])
            assert ((r >= 0.17) & (r <= 0.25) & (bearing.abs() <= 0.6)).all(), placed  # where the cube could be
            spots = torch.cat([cube[None, :2], placed[:, :2]])
            gaps = torch.cdist(spots, spots) + torch.eye(len(spots))
            assert gaps.min() >= scenes.SO101_DISTRACTOR_GAP, gaps  # no two cubes overlap
            again, _ = scenes.so101_dressing(("distractors", level, 5), episode, cube)
            assert torch.equal(again, placed)  # a pure function of (seed, factor, level, episode)
    turns = {scenes.so101_dressing(("colour_swap", 120, 5), e, cube)[1] for e in range(20)}
    assert turns == {120.0, -120.0}
    red = (0.85, 0.15, 0.1)
    assert scenes.turn_hue(red, 120) == pytest.approx((0.1, 0.85, 0.15)) and scenes.turn_hue(red, 360) == \
        pytest.approx(red)
    for factor in (None, ("object_pose", 1.0, 5)):  # nominal and the layout factors dress nothing
        placed, hue = scenes.so101_dressing(factor, 3, cube)
        assert placed.numel() == 0 and hue == 0.0
    with pytest.raises(ValueError, match=r"distractors=1.5: the level is how many"):
        scenes.so101_dressing(("distractors", 1.5, 5), 0, cube)


def test_a_scene_factor_on_a_task_without_its_own_reset_is_refused_before_any_episode():
    with pytest.raises(ValueError, match="object_pose is applied by the task's own reset or renderer; counting "
                                         "applies none"):
        perturb.Perturbed(CountingEnv(2), "object_pose", 0.5, seed=0)
    laid_out_only = CountingEnv(2)
    laid_out_only.scene_factors, laid_out_only.perturb_scene = ("object_pose", "arm_pose"), lambda *a: None
    with pytest.raises(ValueError, match="camera_pose is applied .* counting applies object_pose, arm_pose"):
        perturb.Perturbed(laid_out_only, "camera_pose", 2, seed=0)
    every = {f for f, _ in perturb.parse("all")}
    assert {"camera_pose", "lighting"} <= every  # all: every factor, unless the task says which it applies
    assert not {"camera_pose", "lighting"} & {f for f, _ in perturb.parse("all", ("object_pose", "arm_pose"))}
    assert perturb.changed("aaaaaaaabbbbbbbb", "aaaaaaaacccccccc") == 1 and perturb.changed(None, "ab") is None


def test_the_evaluation_form_names_every_factor():
    from roboloop.evaluation.config import EvalRecipe

    said = EvalRecipe.model_fields["perturb"].description or ""
    assert all(name in said for name in perturb.FACTORS), [n for n in perturb.FACTORS if n not in said]
