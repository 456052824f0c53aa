"""Aggregating datasets (a DAgger round's new version): every frame kept and renumbered, tasks merged by text,
the result valid, convertible, and read by LeRobot itself exactly as the sources were."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.datasets.merge import MergeError, merge_v21
from roboloop.datasets.meta import load_meta
from roboloop.datasets.validate import validate

CAM = {"observation.images.top": (32, 32)}


def _frames(root):
    meta = load_meta(root)
    out = []
    for ep in meta.episodes:
        t = pq.read_table(root / meta.v21_data_path(ep.episode_index)).to_pydict()
        out.append((np.asarray(t["observation.state"]), np.asarray(t["action"]), meta.tasks[t["task_index"][0]]))
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("merge")
    a = generate_v21(root / "a", GenSpec(num_episodes=3, min_length=8, max_length=12, cameras=CAM, seed=1,
                                         tasks=("pick the cube", "open the drawer")))
    b = generate_v21(root / "b", GenSpec(num_episodes=4, min_length=8, max_length=12, cameras=CAM, seed=2,
                                         tasks=("open the drawer", "wipe the table")))
    return root, a, b


def test_merge_keeps_every_frame_renumbered(sources):
    root, a, b = sources
    before = {p: p.read_bytes() for p in sorted(a.rglob("*")) if p.is_file()}
    out = merge_v21([a, b], root / "ab")
    assert {p: p.read_bytes() for p in sorted(a.rglob("*")) if p.is_file()} == before  # sources untouched
    assert validate(out).ok, validate(out).render()
    meta = load_meta(out)
    assert len(meta.episodes) == 7 and meta.info.total_frames == sum(e.length for e in meta.episodes)
    assert sorted(meta.tasks.values()) == ["open the drawer", "pick the cube", "wipe the table"]
    merged, want = _frames(out), _frames(a) + _frames(b)
    for (s1, a1, t1), (s2, a2, t2) in zip(merged, want, strict=True):
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(a1, a2)
        assert t1 == t2
    index = np.concatenate([pq.read_table(out / meta.v21_data_path(e.episode_index))["index"].to_numpy()
                            for e in meta.episodes])
    np.testing.assert_array_equal(index, np.arange(len(index)))
    from roboloop.fsutil import read_marker

    assert read_marker(out)["merged_from"] == ["a", "b"]  # the version's lineage, in the dataset


def test_merged_dataset_converts_and_lerobot_reads_it(sources):
    from tests.conformance import lerobot_side

    root, a, b = sources
    out = root / "ab2"
    merge_v21([a, b], out)
    v3 = convert(out, root / "ab2_v3", ConvertConfig(progress=False))
    assert len(load_meta(v3).episodes) == 7
    verdict = lerobot_side.run(out, root / "lerobot_work")
    assert verdict.ok, verdict.error
    snap = verdict.snapshot
    want = _frames(a) + _frames(b)
    np.testing.assert_allclose(snap.state, np.concatenate([w[0] for w in want]), rtol=0, atol=0)
    assert snap.tasks == [w[2] for w in want]


def test_merge_names_the_incompatible_feature(sources, tmp_path):
    root, a, _ = sources
    c = generate_v21(tmp_path / "c", GenSpec(num_episodes=2, min_length=8, max_length=10, cameras=CAM,
                                             state_dim=7, seed=3))
    with pytest.raises(MergeError, match="observation.state"):
        merge_v21([a, c], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    with pytest.raises(FileExistsError):
        merge_v21([a], a)  # never over a folder roboloop did not create
