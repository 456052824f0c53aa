"""Rollout videos a person can judge: upscaled without blur to 256 px on the short side, a caption band (model and
version, episode, outcome and steps, instruction, step shown), a failed episode among them whenever one failed, and a
contact sheet. The frames are decoded back and compared with what the camera saw."""

from __future__ import annotations

import av
import numpy as np
import torch
from PIL import Image

from roboloop.evaluation import videos
from roboloop.evaluation.evaluator import evaluate
from roboloop.sim.protocol import StepResult
from tests.unit.evaluation.test_perturb import CountingEnv


def _episode(success: bool, number: int, steps: int = 12) -> dict:
    rng = np.random.default_rng(number)
    frame = rng.integers(0, 255, (64, 80, 3), dtype=np.uint8)  # blocks a nearest upscale keeps sharp
    return {"success": success, "episode": number, "task": "reach the red ball",
            "images": {"observation.images.top": [frame] * steps}}


def _decoded(path: str) -> np.ndarray:
    with av.open(path) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def test_a_failure_is_shown_whenever_one_happened():
    ok, bad = [_episode(True, 0), _episode(True, 1)], _episode(False, 5)
    assert [e["episode"] for e in videos.pick(ok, bad)] == [0, 5]
    assert videos.pick(ok, None) == ok
    mixed = [_episode(False, 0), _episode(True, 1)]
    assert videos.pick(mixed, bad) == mixed  # one failure is already there


def test_videos_are_upscaled_captioned_and_small(tmp_path):
    ep = _episode(False, 7)
    path, = videos.write_videos([ep], tmp_path, fps=30, label="reach-vla@3")
    assert path.endswith("rollout00_observation_images_top_failure.mp4")
    frames = _decoded(path)
    assert frames.shape[0] == 12 and frames.shape[2] == 80 * 4  # 64 -> 256 on the short side: x4, width too
    picture = frames[:, -256:].astype(int)
    want = np.repeat(np.repeat(ep["images"]["observation.images.top"][0], 4, 0), 4, 1).astype(int)
    assert np.abs(picture - want).mean() < 12  # the camera's frame, not a blur of it (H.264 at crf 23)
    band = frames[0, : frames.shape[1] - 256]
    assert band.shape[0] >= 30 and (band[:, :5, 0] > 150).mean() > 0.8  # the failure's red bar
    assert (band[:, 20:] > 200).any()  # white caption text
    assert sum(f.stat().st_size for f in (tmp_path / "videos").iterdir()) < 200_000
    assert videos.caption(ep, "reach-vla@3") == "reach-vla@3  episode 7  FAILED in 12 steps"


def test_contact_sheet_has_a_row_per_rollout(tmp_path):
    sheet = videos.contact_sheet([_episode(True, 0), _episode(False, 3)], tmp_path / "contact.png", "m@1")
    img = np.asarray(Image.open(sheet))
    assert img.shape[1] == videos.SHEET_FRAMES * 160  # six frames of 128 x 160 (64 x 80 doubled) per row
    assert img.shape[0] > 2 * 128 and sheet.stat().st_size < 400_000  # inlined in the report (png_markdown's cap)


class FailsThird(CountingEnv):
    """Episode 2 (and every 3rd after it) fails."""

    def step(self, actions: torch.Tensor) -> StepResult:
        numbers = self.number.copy()
        res = super().step(actions)
        success = res.done & torch.as_tensor([n % 3 != 2 for n in numbers])
        return StepResult(res.obs, res.reward, res.done, success)


def test_evaluate_shows_the_first_failure_and_names_the_model(tmp_path):
    from tests.unit.evaluation.test_perturb import ChunkPolicy

    report, _ = evaluate(FailsThird(2), ChunkPolicy(), episodes=6, execute_steps=4, videos=2, output_dir=tmp_path,
                         label="reach-vla@3")
    assert [e["success"] for e in sorted(report.per_episode, key=lambda e: e["index"])] == [1, 1, 0, 1, 1, 0]
    assert [v.rsplit("_", 1)[1] for v in report.videos] == ["success.mp4", "failure.mp4"], report.videos
    assert report.contact_sheet == str(tmp_path / "contact.png") and (tmp_path / "contact.png").is_file()


def test_the_initial_states_hash_names_the_episodes_not_the_env_count():
    """Episode k starts in state (k, 0) however many envs run: the same hash at 1 and 3 envs; another scene (the
    state shifted) is another hash."""
    from tests.unit.evaluation.test_perturb import ChunkPolicy

    one, _ = evaluate(CountingEnv(1), ChunkPolicy(), episodes=5, execute_steps=4, videos=0)
    three, _ = evaluate(CountingEnv(3), ChunkPolicy(), episodes=5, execute_steps=4, videos=0)
    assert one.initial_states == three.initial_states and len(one.initial_states) == 5 * 8
    assert one.initial_states_sha256 == three.initial_states_sha256 and len(one.initial_states_sha256) == 64

    class Shifted(CountingEnv):
        def _obs(self):
            o = super()._obs()
            return type(o)(o.state + 1, o.images, o.instructions)

    other, _ = evaluate(Shifted(3), ChunkPolicy(), episodes=5, execute_steps=4, videos=0)
    assert other.initial_states_sha256 != one.initial_states_sha256
