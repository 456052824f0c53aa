"""Differential conformance: each dataset goes to LeRobot 0.6.1 and to roboloop.

The rule: if LeRobot accepts a dataset, roboloop validates it clean (warnings allowed),
converts it (v2.x), loads it with its training loader, and the state, action, episode
bounds, tasks and decoded camera frames equal LeRobot's; LeRobot also loads roboloop's
conversion and reads the same. If LeRobot refuses it, roboloop's report names the reason
and nothing is converted. Declared exceptions (`superset`, `strict`) say why.
"""

from __future__ import annotations

import numpy as np
import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.validate import DatasetDefectError
from tests.conformance import lerobot_side, roboloop_side
from tests.conformance.cases import CASES, Case

# LeRobot's converter (HF datasets, PyAV) warns about its own internals.
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

MAX_PIXEL_DIFF = 2  # colour conversion rounding; the same decoder (FFmpeg via PyAV) on both sides
# depth: one 12-bit quantum of LeRobot's log quantiser at 10 m is 0.33% of the depth; +1 mm for the rounding
DEPTH_REL, DEPTH_ABS_MM = 0.0035, 1.0


def assert_same(ours: lerobot_side.Snapshot, theirs: lerobot_side.Snapshot) -> None:
    assert [tuple(map(int, b)) for b in ours.bounds] == [tuple(map(int, b)) for b in theirs.bounds]
    np.testing.assert_array_equal(ours.state, theirs.state)
    np.testing.assert_array_equal(ours.action, theirs.action)
    assert ours.tasks == theirs.tasks
    assert set(ours.frames) == set(theirs.frames)
    assert ours.depth_keys == theirs.depth_keys
    for key, frames in theirs.frames.items():
        assert set(ours.frames[key]) == set(frames), key
        for i, theirs_img in frames.items():
            assert ours.frames[key][i].shape == theirs_img.shape, (key, i)
            if key in theirs.depth_keys:  # millimetres, as LeRobot's loader returns them
                np.testing.assert_allclose(ours.frames[key][i], theirs_img, rtol=DEPTH_REL, atol=DEPTH_ABS_MM,
                                           err_msg=f"{key} frame {i}")
                continue
            diff = np.abs(ours.frames[key][i].astype(int) - theirs_img.astype(int))
            assert diff.max() <= MAX_PIXEL_DIFF, f"{key} frame {i}: max diff {diff.max()}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache: dict[str, object] = {}

    def get(case: Case):
        if case.name not in cache:
            work = tmp_path_factory.mktemp("case")
            src = work / "src"
            case.build(src)
            cache[case.name] = (src, work, lerobot_side.run(src, work))
        return cache[case.name]

    return get


@pytest.mark.parametrize("case", CASES, ids=str)
def test_conformance(case: Case, built):
    src, work, lerobot = built(case)
    assert lerobot.ok == case.lerobot_accepts, f"LeRobot's verdict changed: {lerobot.error or 'accepted'}"
    if not lerobot.ok:  # the reason, not only that it refused: its exception type and what it names
        want_type, want_text = case.lerobot_error
        assert lerobot.error_type == want_type and want_text in lerobot.error, lerobot.error
    before = sorted((p.relative_to(src).as_posix(), p.stat().st_size) for p in src.rglob("*") if p.is_file())
    if case.roboloop_refuses:
        verdict = roboloop_side.run(src, work)
        assert not verdict.report.ok
        assert case.roboloop_refuses in verdict.report.codes(), verdict.report.human()
        with pytest.raises(DatasetDefectError):
            convert(src, work / "refused", ConvertConfig(progress=False))
        assert not (work / "refused").exists()
    else:
        verdict = roboloop_side.run(src, work)
        assert verdict.report.ok, verdict.report.human()
        assert verdict.snapshot is not None
        if lerobot.ok:
            assert_same(verdict.snapshot, lerobot.snapshot)
        if verdict.v3 != src:  # our conversion loads in LeRobot and reads like the source
            reread = lerobot_side.load(verdict.v3)
            assert_same(verdict.snapshot, reread)
            if lerobot.ok:
                assert_same(reread, lerobot.snapshot)
    after = sorted((p.relative_to(src).as_posix(), p.stat().st_size) for p in src.rglob("*") if p.is_file())
    assert before == after, "the source was modified"


def test_matrix_covers_the_required_variants():
    names = " | ".join(c.name for c in CASES)
    for needle in ("nested list", "lerobot-writer: 2 video", "depth", "image features stored in parquet", "names null",
                   "dict of lists", "robot_type null", "unknown keys", "chunks_size", "float64 timestamps",
                   "int32", "splits", "v2.0 layout", "unicode"):
        assert needle in names, needle
