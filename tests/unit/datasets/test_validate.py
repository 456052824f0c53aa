"""Each defect class is planted in a copy of a good dataset and must be named where it is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from roboloop.cli import main
from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.validate import DatasetDefectError, validate

EP2_DATA = "data/chunk-000/episode_000002.parquet"
EP2_TOP = "videos/chunk-000/observation.images.top/episode_000002.mp4"


def _edit_json(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def _edit_jsonl(path: Path, fn) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = fn(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _edit_parquet(path: Path, fn) -> None:
    pq.write_table(fn(pq.read_table(path)), path)


def _set_column(table: pa.Table, name: str, values) -> pa.Table:
    i = table.column_names.index(name)
    return table.set_column(i, name, pa.array(values, type=table.schema.field(name).type))


def _find(report, code, file=None, episode=None, field=None, severity="defect"):
    """A finding of this class at this place, of this severity (a defect refuses the dataset, a warning does not:
    a test of a defect must not pass on a warning)."""
    pool = report.defects if severity == "defect" else report.warnings
    hits = [d for d in pool if d.code == code and (file is None or d.file == file)
            and (episode is None or d.episode == episode) and (field is None or d.field == field)]
    assert hits, f"no {code} {severity} at {file} ep={episode} field={field}; got:\n{report.human()}"
    return hits[0]


def test_good_dataset_has_no_defects(small_v21):
    report = validate(small_v21, deep=True)
    assert report.ok, report.human()
    assert report.num_episodes == 6


def test_missing_data_and_video_files(small_copy):
    (small_copy / EP2_DATA).unlink()
    (small_copy / EP2_TOP).unlink()
    r = validate(small_copy)
    _find(r, "missing_file", EP2_DATA, 2)
    _find(r, "missing_file", EP2_TOP, 2)


def test_extra_file(small_copy):
    shutil.copy(small_copy / EP2_DATA, small_copy / "data/chunk-000/episode_000099.parquet")
    r = validate(small_copy)  # a stray file breaks nothing: named, not refused
    assert r.ok and _find(r, "extra_file", "data/chunk-000/episode_000099.parquet", 99, severity="warning")


def test_misplaced_video_names_where_it_is(small_copy):
    wrong = small_copy / "videos/observation.images.top/episode_000002.mp4"
    wrong.parent.mkdir(parents=True)
    (small_copy / EP2_TOP).rename(wrong)
    d = _find(validate(small_copy), "misplaced_file", EP2_TOP, 2)
    assert "videos/observation.images.top/episode_000002.mp4" in d.message


def test_row_count_against_episodes_and_info(small_copy):
    _edit_parquet(small_copy / EP2_DATA, lambda t: t.slice(0, t.num_rows - 1))
    _edit_json(small_copy / "meta/info.json", lambda d: d.update(total_frames=d["total_frames"] + 5))
    r = validate(small_copy)
    _find(r, "row_count", EP2_DATA, 2, "length")
    _find(r, "row_count", "meta/info.json", None, "total_frames")


def test_episode_and_global_index_continuity(small_copy):
    _edit_parquet(small_copy / EP2_DATA, lambda t: _set_column(t, "index", pc.add(t["index"], 1)))
    path = small_copy / "data/chunk-000/episode_000003.parquet"
    _edit_parquet(path, lambda t: _set_column(t, "frame_index", [0, *range(2, t.num_rows + 1)]))
    _edit_parquet(small_copy / "data/chunk-000/episode_000004.parquet",
                  lambda t: _set_column(t, "episode_index", [4] * (t.num_rows - 1) + [5]))
    r = validate(small_copy)
    _find(r, "index", EP2_DATA, 2, "index")
    _find(r, "frame_index", "data/chunk-000/episode_000003.parquet", 3, "frame_index")
    _find(r, "episode_index", "data/chunk-000/episode_000004.parquet", 4, "episode_index")


def test_episode_table_gap(small_copy):
    _edit_jsonl(small_copy / "meta/episodes.jsonl", lambda rows: [r for r in rows if r["episode_index"] != 3])
    r = validate(small_copy)
    _find(r, "episode_index", "meta/episodes.jsonl", 3)


def test_timestamps_monotonic_and_on_fps_grid(small_copy):
    def swap(t):
        ts = t["timestamp"].to_pylist()
        ts[3], ts[4] = ts[4], ts[3]
        return _set_column(t, "timestamp", ts)

    _edit_parquet(small_copy / EP2_DATA, swap)
    path = small_copy / "data/chunk-000/episode_000001.parquet"
    _edit_parquet(path, lambda t: _set_column(t, "timestamp", [i / 25 for i in range(t.num_rows)]))
    r = validate(small_copy)
    assert "not strictly increasing at row 4" in _find(r, "timestamp", EP2_DATA, 2).message
    assert "fps grid" in _find(r, "timestamp", "data/chunk-000/episode_000001.parquet", 1).message


def test_feature_dtype_and_shape_against_schema(small_copy):
    # float64 where float32 is declared: LeRobot casts it on load, so it is a warning, not a defect
    _edit_parquet(small_copy / EP2_DATA, lambda t: t.set_column(
        t.column_names.index("action"), "action", pc.cast(t["action"], pa.list_(pa.float64()))))
    r = validate(small_copy)
    assert r.ok and _find(r, "dtype", EP2_DATA, 2, "action", severity="warning")
    # strings where numbers are declared, or a vector length that disagrees with the shape: defects
    _edit_parquet(small_copy / "data/chunk-000/episode_000003.parquet", lambda t: t.set_column(
        t.column_names.index("action"), "action", pa.array([str(v) for v in t["action"].to_pylist()])))
    _edit_json(small_copy / "meta/info.json",
               lambda d: d["features"]["observation.state"].update(shape=[7]))
    r = validate(small_copy)
    _find(r, "schema", "data/chunk-000/episode_000003.parquet", 3, "action")
    _find(r, "schema", field="observation.state")
    assert not r.ok


def test_video_frames_fps_resolution(small_copy):
    from roboloop.datasets import video

    other = small_copy / "videos/chunk-000/observation.images.wrist/episode_000001.mp4"
    frames = video.decode_frames_at(other, [0.0])
    video.encode_frames(np.repeat(frames, 3, axis=0), small_copy / EP2_TOP, fps=30)  # 3 frames only
    big = np.zeros((20, 64, 96, 3), dtype=np.uint8)
    video.encode_frames(big, small_copy / "videos/chunk-000/observation.images.top/episode_000003.mp4", fps=15)
    r = validate(small_copy)
    assert "frames" in _find(r, "video", EP2_TOP, 2).message
    msgs = " ".join(d.message for d in r.defects if d.episode == 3 and d.code == "video")
    assert "resolution 96x64" in msgs and "15 fps" in msgs


def test_corrupt_video_caught(small_copy):
    p = small_copy / EP2_TOP
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 3])
    r = validate(small_copy, deep=True)
    assert any(d.file == EP2_TOP and d.code in ("corrupt_file", "video") for d in r.defects), r.human()


def test_task_indices_that_do_not_resolve(small_copy):
    _edit_parquet(small_copy / EP2_DATA, lambda t: _set_column(t, "task_index", [42] * t.num_rows))
    _edit_jsonl(small_copy / "meta/episodes.jsonl",
                lambda rows: [dict(r, tasks=["fly to the moon"]) if r["episode_index"] == 1 else r for r in rows])
    r = validate(small_copy)
    _find(r, "task", EP2_DATA, 2, "task_index")
    _find(r, "task", "meta/episodes.jsonl", 1, "tasks")


def test_missing_stats(small_copy):
    _edit_jsonl(small_copy / "meta/episodes_stats.jsonl",
                lambda rows: [r for r in rows if r["episode_index"] != 4])
    r = validate(small_copy)  # stats are computed from the data where missing: a warning
    assert r.ok and _find(r, "stats", "meta/episodes_stats.jsonl", 4, severity="warning")
    (small_copy / "meta/episodes_stats.jsonl").unlink()
    r = validate(small_copy)
    assert r.ok and _find(r, "stats", "meta/episodes_stats.jsonl", severity="warning")


@pytest.mark.parametrize("template", ["../outside/{episode_index}.parquet", "/etc/{episode_index}.parquet"])
def test_paths_escaping_root_are_refused(small_copy, template):
    _edit_json(small_copy / "meta/info.json", lambda d: d.update(data_path=template))
    r = validate(small_copy)
    assert [d.code for d in r.defects] == ["unsafe_path"]
    assert r.defects[0].field == "data_path"


def test_v30_defects(small_v21, tmp_path):
    out = convert(small_v21, tmp_path / "v3", ConvertConfig(progress=False))
    assert validate(out).ok
    ep_file = next((out / "meta/episodes").rglob("*.parquet"))
    _edit_parquet(ep_file, lambda t: _set_column(t, "dataset_from_index",
                                                 [v + (1 if i == 2 else 0) for i, v in
                                                  enumerate(t["dataset_from_index"].to_pylist())]))
    (out / "meta/stats.json").unlink()
    r = validate(out)
    _find(r, "index", "meta/episodes", 2, "dataset_from_index")
    _find(r, "stats", "meta/stats.json", severity="warning")


def test_cli_exit_codes_and_json(small_copy, capsys):
    assert main(["validate", str(small_copy)]) == 0
    (small_copy / EP2_DATA).unlink()
    assert main(["validate", str(small_copy), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert doc["ok"] is False and doc["defects"][0]["file"] == EP2_DATA


def test_many_misplaced_videos_are_one_defect_naming_where_they_are(large_v21, tmp_path):
    """A dataset whose videos sit in video/ while its template says videos/: one line, with the count."""
    ds = tmp_path / "ds"
    shutil.copytree(large_v21, ds)
    shutil.move(ds / "videos", ds / "video")
    r = validate(ds)
    misplaced = [d for d in r.defects if d.code == "misplaced_file"]
    assert len(misplaced) == 1 and misplaced[0].count == 400  # 200 episodes x 2 cameras
    assert "400 video files are under video/ instead of videos/" in misplaced[0].message
    assert "missing_file" not in r.codes()
    with pytest.raises(DatasetDefectError):
        convert(ds, tmp_path / "out", ConvertConfig(progress=False))
    assert not (tmp_path / "out").exists()


def test_misplaced_data_across_top_level_folders(small_copy):
    (small_copy / "parquet").mkdir()
    shutil.move(small_copy / "data/chunk-000", small_copy / "parquet/chunk-000")
    d = _find(validate(small_copy), "misplaced_file")
    assert d.count == 6 and "6 data files are under parquet/ instead of data/" in d.message


def test_lfs_pointers_reported_once_with_the_fix(small_copy):
    for p in [*small_copy.rglob("*.mp4"), small_copy / "meta/episodes_stats.jsonl"]:
        p.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "a" * 64 + "\nsize 12345\n")
    r = validate(small_copy)
    lfs = [d for d in r.defects if d.code == "lfs_pointer"]
    assert len(lfs) == 1 and lfs[0].count == 13 and "git lfs pull" in lfs[0].message
    assert "corrupt_file" not in r.codes()  # the pointers are not reported again as unreadable videos


def test_truncated_parquet_and_mp4_are_named(small_copy):
    for rel in (EP2_DATA, EP2_TOP):
        p = small_copy / rel
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    r = validate(small_copy)
    assert "cut short" in _find(r, "corrupt_file", EP2_DATA, 2).message
    assert "moov" in _find(r, "corrupt_file", EP2_TOP, 2).message


def test_non_finite_values_name_episode_frame_and_column(small_copy):
    def poison(t):
        vals = np.asarray(t["action"].to_pylist(), dtype=np.float32)
        vals[5, 3] = np.inf
        return t.set_column(t.column_names.index("action"), "action",
                            pa.FixedSizeListArray.from_arrays(pa.array(vals.ravel()), vals.shape[1]))

    _edit_parquet(small_copy / EP2_DATA, poison)
    d = _find(validate(small_copy), "non_finite", EP2_DATA, 2, "action")
    assert "frame 5, dim 3" in d.message


def test_a_file_is_not_a_dataset(small_copy):
    r = validate(small_copy / "meta/info.json")
    assert not r.ok and "is a file, not a dataset folder" in r.defects[0].message


def test_symlinks_that_escape_the_root_are_refused(small_copy, tmp_path):
    outside = tmp_path / "outside.mp4"
    shutil.copy(small_copy / EP2_TOP, outside)
    (small_copy / EP2_TOP).unlink()
    (small_copy / EP2_TOP).symlink_to(outside)
    r = validate(small_copy)
    assert _find(r, "unsafe_path", EP2_TOP).severity == "error"
    with pytest.raises(DatasetDefectError):
        convert(small_copy, tmp_path / "out", ConvertConfig(progress=False))
    inside = small_copy / "videos/chunk-000/observation.images.top/episode_000003.mp4"
    (small_copy / EP2_TOP).unlink()
    (small_copy / EP2_TOP).symlink_to(inside)  # a link inside the dataset is fine (checked through the link)
    assert "unsafe_path" not in validate(small_copy).codes()


def test_an_episode_encoded_with_other_settings_is_named(small_copy):
    """v3 joins a camera's episodes by stream copy: one episode from another encoder setting (here x264's
    ultrafast preset with B-frames) used to pass `validate --deep`, then `convert` failed with "[Errno 22]
    Invalid argument" on a temporary file."""
    from fractions import Fraction

    import av

    p = sorted(small_copy.glob("videos/*/observation.images.top/episode_000002.mp4"))[0]
    with av.open(str(p)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    tmp = p.with_suffix(".other.mp4")
    with av.open(str(tmp), "w") as out:
        st = out.add_stream("libx264", rate=Fraction(30), options={"preset": "ultrafast", "bf": "3"})
        st.pix_fmt, (st.height, st.width) = "yuv420p", frames[0].shape[:2]
        for a in frames:
            for pk in st.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                out.mux(pk)
        for pk in st.encode():
            out.mux(pk)
    tmp.replace(p)
    d = _find(validate(small_copy), "video", episode=2, field="observation.images.top")
    assert "encoded with other settings" in d.message and "re-encode it" in d.message
