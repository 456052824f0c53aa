"""v2.1 -> v3.0 conversion against LeRobot itself: its loader reads ours, its converter agrees."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from roboloop.datasets import video
from roboloop.datasets.convert import ConvertConfig, convert, plan_files
from roboloop.datasets.meta import load_meta
from roboloop.datasets.validate import DatasetDefectError, validate

CAPS = {"data_file_size_in_mb": 1, "video_file_size_in_mb": 1}


@pytest.fixture(scope="module")
def converted(large_v21, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("ours") / "v3"
    return convert(large_v21, dst, ConvertConfig(progress=False, **CAPS))


@pytest.fixture(scope="module")
def lerobot_converted(large_v21, tmp_path_factory) -> Path:
    """LeRobot's own converter on a copy (it moves its input aside, so never on the original)."""
    root = tmp_path_factory.mktemp("lerobot") / "ds"
    shutil.copytree(large_v21, root)
    subprocess.run(
        [sys.executable, "-m", "lerobot.scripts.convert_dataset_v21_to_v30", "--repo-id=test/ds",
         f"--root={root}", "--push-to-hub=false", "--data-file-size-in-mb=1", "--video-file-size-in-mb=1"],
        check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return root


def test_plan_files_matches_lerobot_greedy_rule():
    assert plan_files([0.4, 0.4, 0.4, 0.1], 1.0, None) == [(0, 0), (0, 0), (0, 1), (0, 1)]
    assert plan_files([2.0, 0.1], 1.0, None) == [(0, 0), (0, 1)]
    assert plan_files([0.1] * 5, 100, 2) == [(0, 0), (0, 0), (0, 1), (0, 1), (0, 2)]
    assert plan_files([1.0] * 3, 1.0, None, chunks_size=2) == [(0, 0), (0, 1), (1, 0)]


def test_output_is_valid_and_multi_file(converted):
    report = validate(converted, deep=True)
    assert report.ok, report.human()
    assert len(list((converted / "data").rglob("*.parquet"))) > 1
    for key in ("observation.images.top", "observation.images.wrist"):
        assert len(list((converted / "videos" / key).rglob("*.mp4"))) >= 1


def test_tasks_table_reads_back_in_pandas_like_lerobots_own(converted, lerobot_converted):
    """meta/tasks.parquet is written without pandas; pandas (LeRobot's reader) restores the same frame, task
    strings as the index, as from the file LeRobot's converter wrote with pandas."""
    import pandas as pd

    ours, theirs = (pd.read_parquet(root / "meta" / "tasks.parquet") for root in (converted, lerobot_converted))
    pd.testing.assert_frame_equal(ours, theirs)
    assert ours.index.name == "task" and len(ours) > 1


def test_episodes_metadata_equals_lerobot_converter(converted, lerobot_converted):
    ours = pq.read_table(next((converted / "meta/episodes").rglob("*.parquet"))).to_pylist()
    theirs = pq.read_table(next((lerobot_converted / "meta/episodes").rglob("*.parquet"))).to_pylist()
    assert len(ours) == len(theirs) == 200
    for a, b in zip(ours, theirs, strict=True):
        extra = set(a) - set(b)
        assert all(k.startswith("stats/") and k.rsplit("/", 1)[1] in {"q01", "q10", "q50", "q90", "q99"}
                   for k in extra), extra
        for key, expected in b.items():
            got = a[key]
            if isinstance(expected, float) or (isinstance(expected, list) and expected
                                               and not isinstance(expected[0], str)):
                np.testing.assert_allclose(np.asarray(got, float), np.asarray(expected, float), rtol=0,
                                           atol=1e-12, err_msg=f"episode {b['episode_index']} {key}")
            else:
                assert got == expected, (b["episode_index"], key)
    assert json.loads((converted / "meta/info.json").read_text()) == \
        json.loads((lerobot_converted / "meta/info.json").read_text())
    ours_stats = json.loads((converted / "meta/stats.json").read_text())
    theirs_stats = json.loads((lerobot_converted / "meta/stats.json").read_text())
    for feat, fstats in theirs_stats.items():
        for name, value in fstats.items():
            np.testing.assert_allclose(ours_stats[feat][name], value, rtol=1e-12, atol=1e-12)
    assert {"q01", "q50", "q99"} <= set(ours_stats["action"])


def test_quantiles_close_to_exact(converted, large_v21):
    meta = load_meta(large_v21)
    actions = np.concatenate([
        np.stack(pq.read_table(large_v21 / meta.v21_data_path(e.episode_index))["action"].to_numpy(
            zero_copy_only=False)) for e in meta.episodes])
    st = json.loads((converted / "meta/stats.json").read_text())["action"]
    span = actions.max(0) - actions.min(0)
    for q, key in ((0.01, "q01"), (0.5, "q50"), (0.99, "q99")):
        assert np.all(np.abs(np.quantile(actions, q, axis=0) - st[key]) <= span / 1000)


@pytest.mark.slow
def test_lerobot_dataset_loads_and_rows_equal_source(converted, large_v21):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("test/ds", root=converted)
    meta = load_meta(large_v21)
    assert ds.num_episodes == 200 and len(ds) == meta.info.total_frames
    hf = ds.hf_dataset.with_format(None)
    state = np.asarray(hf["observation.state"], np.float32)
    action = np.asarray(hf["action"], np.float32)
    start = 0
    for ep in meta.episodes:
        src = pq.read_table(large_v21 / meta.v21_data_path(ep.episode_index))
        np.testing.assert_array_equal(state[start:start + ep.length],
                                      np.stack(src["observation.state"].to_numpy(zero_copy_only=False)))
        np.testing.assert_array_equal(action[start:start + ep.length],
                                      np.stack(src["action"].to_numpy(zero_copy_only=False)))
        start += ep.length
    # Frames through LeRobot's own decoder equal the source's decode.
    for idx in (0, 137, len(ds) - 1):
        item = ds[idx]
        ep, fi = int(item["episode_index"]), int(item["frame_index"])
        src = large_v21 / meta.v21_video_path(ep, "observation.images.top")
        expected = video.decode_frames_at(src, [fi / meta.info.fps])[0]
        got = (item["observation.images.top"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        np.testing.assert_array_equal(got, expected)


def test_decoded_frames_equal_source_for_every_episode(converted, large_v21):
    src_meta, out_meta = load_meta(large_v21), load_meta(converted)
    rng = np.random.default_rng(0)
    fps = src_meta.info.fps
    for key in src_meta.info.video_keys:
        by_file: dict[Path, list] = {}
        for ep in out_meta.episodes:
            loc = ep.videos[key]
            frames = sorted({0, ep.length - 1, int(rng.integers(ep.length))})
            path = converted / out_meta.info.video_path.format(
                video_key=key, chunk_index=int(loc["chunk_index"]), file_index=int(loc["file_index"]))
            by_file.setdefault(path, []).append((ep, loc["from_timestamp"], frames))
        for path, items in by_file.items():
            ts = [f0 + fi / fps for _, f0, frames in items for fi in frames]
            got = video.decode_frames_at(path, ts)
            expected = np.concatenate([
                video.decode_frames_at(large_v21 / src_meta.v21_video_path(ep.episode_index, key),
                                       [fi / fps for fi in frames]) for ep, _, frames in items])
            np.testing.assert_array_equal(got, expected)


def test_source_untouched_and_destination_refused_if_present(small_v21, tmp_path):
    before = {p: p.stat().st_mtime_ns for p in small_v21.rglob("*")}
    dst = convert(small_v21, tmp_path / "out", ConvertConfig(progress=False))
    assert {p: p.stat().st_mtime_ns for p in small_v21.rglob("*")} == before
    with pytest.raises(FileExistsError):
        convert(small_v21, dst, ConvertConfig(progress=False))


def test_episode_cap(small_v21, tmp_path):
    dst = convert(small_v21, tmp_path / "out", ConvertConfig(progress=False, max_episodes_per_file=2))
    assert len(list((dst / "data").rglob("*.parquet"))) == 3
    assert validate(dst).ok


def test_defective_source_is_refused_and_nothing_written(small_copy, tmp_path):
    (small_copy / "videos/chunk-000/observation.images.top/episode_000002.mp4").unlink()
    with pytest.raises(DatasetDefectError) as err:
        convert(small_copy, tmp_path / "out", ConvertConfig(progress=False))
    assert "missing_file" in err.value.report.codes()
    assert list(tmp_path.iterdir()) == [small_copy.parent / "ds"] or not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))]


def test_killed_conversion_leaves_no_dst_and_rerun_succeeds(large_v21, tmp_path):
    """SIGKILL with a data file written and the rest of the conversion pending (the child's data writer waits
    after its first file, so the kill lands there whatever the machine's load: it once finished first)."""
    dst, written = tmp_path / "out", tmp_path / "written"
    code = ("import sys, time, pathlib; import roboloop.datasets.convert as c; real = c.write_data_file\n"
            "def write_then_wait(*a):\n"
            "    out = real(*a); pathlib.Path(sys.argv[3]).touch(); time.sleep(600); return out\n"
            "c.write_data_file = write_then_wait\n"
            "c.convert(sys.argv[1], sys.argv[2], c.ConvertConfig(progress=False, workers=1, "
            "data_file_size_in_mb=0.05, video_file_size_in_mb=0.05))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(large_v21), str(dst), str(written)],
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not written.exists():
        time.sleep(0.05)
    assert proc.poll() is None and written.exists(), "the conversion ended before its first data file"
    assert list(tmp_path.glob(".out.roboloop-tmp-*/data/*/*.parquet"))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not dst.exists()
    assert list(tmp_path.glob(".out.roboloop-tmp-*"))  # the debris of the killed run
    convert(large_v21, dst, ConvertConfig(progress=False))
    assert validate(dst).ok
    assert not list(tmp_path.glob(".out.roboloop-tmp-*"))  # cleaned by the rerun


def test_av1_dataset_converts_and_loads(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from roboloop.datasets.generate import GenSpec, generate_v21

    spec = GenSpec(num_episodes=3, min_length=8, max_length=12, codec="libsvtav1",
                   cameras={"observation.images.top": (64, 64)}, seed=5)
    src = generate_v21(tmp_path / "av1", spec)
    assert video.probe(src / "videos/chunk-000/observation.images.top/episode_000000.mp4").codec in ("av1", "libdav1d")
    dst = convert(src, tmp_path / "v3", ConvertConfig(progress=False))
    assert validate(dst, deep=True).ok
    ds = LeRobotDataset("test/av1", root=dst)
    item = ds[len(ds) - 1]
    expected = video.decode_frames_at(src / "videos/chunk-000/observation.images.top/episode_000002.mp4",
                                      [int(item["frame_index"]) / spec.fps])[0]
    got = (item["observation.images.top"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    np.testing.assert_array_equal(got, expected)


def test_non_integer_fps_kept_exactly_end_to_end(tmp_path):
    """29.97 fps: validated, converted without truncation, valid by our validator and readable by LeRobot."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from roboloop.datasets.generate import GenSpec, generate_v21
    from roboloop.training.data import V3Dataset

    src = generate_v21(tmp_path / "v21", GenSpec(num_episodes=2, min_length=60, max_length=70, fps=29.97,
                                                 cameras={"observation.images.top": (32, 32)}, seed=2))
    assert validate(src).ok
    out = convert(src, tmp_path / "v3", ConvertConfig(progress=False))
    info = json.loads((out / "meta/info.json").read_text())
    assert info["fps"] == 29.97 and info["features"]["action"]["fps"] == 29.97
    assert validate(out, deep=True).ok
    ds = V3Dataset(out)
    last = ds.ep_to[1] - 1
    frames = ds.decode_window(1, "observation.images.top", int(ds.frame_index[last]), 1, (32, 32))
    theirs = LeRobotDataset("t/fps", root=out, video_backend="pyav")[last]["observation.images.top"]
    np.testing.assert_allclose(frames[0].transpose(2, 0, 1) / 255, theirs.numpy(), atol=2 / 255)


def test_rows_table_equals_arrows_from_pylist():
    """The episode table is built through Arrow's JSON reader (no pandas): the same table as from_pylist."""
    import pyarrow as pa

    from roboloop.datasets.arrowutil import rows_table

    rows = [{"episode_index": i, "tasks": ["pick the cube", "ünïcode"][: i + 1], "length": 10 ** (i + 9),
             "stats/x/mean": [0.1, 1 / 3, 1e-300, -2.5e300], "stats/x/count": [7],
             "stats/img/min": [[[0.0]], [[0.5]], [[1.0 / 7]]], "ok": i == 0, "name": f"e{i}"} for i in range(2)]
    ours, theirs = rows_table(rows), pa.Table.from_pylist(rows)
    assert ours.schema == theirs.schema and ours.equals(theirs)
    assert ours.to_pylist() == rows
    with pytest.raises(ValueError):
        rows_table([{"x": float("nan")}])


def test_scan_reads_what_a_full_probe_and_demux_read(small_v21, tmp_path):
    """`video.scan` opens a file once without FFmpeg's decoding probe: the same facts as `probe` and as a full
    demux, the pixel format left to the parameter sets; a file without parameter sets (mjpeg) gets its first
    frame's pixel format, so encodings stay comparable."""
    import av

    path = next(small_v21.glob("videos/**/*.mp4"))
    pr, index = video.scan(path)
    full = video.probe(path)
    assert pr.extradata_sha1 and pr.pix_fmt is None and full.pix_fmt == "yuv420p"
    assert {**vars(pr), "pix_fmt": full.pix_fmt} == vars(full)
    with av.open(str(path)) as c:
        packets = [p for p in c.demux(c.streams.video[0]) if p.size]
    assert index.count == len(packets) == full.num_frames and index.corrupt == 0
    assert len(index.keyframe_times) == sum(p.is_keyframe for p in packets) >= 1

    mj = tmp_path / "mjpeg.mp4"
    with av.open(str(mj), "w") as out:
        st = out.add_stream("mjpeg", rate=30)
        st.pix_fmt, st.width, st.height = "yuvj420p", 64, 48
        for i in range(5):
            for p in st.encode(av.VideoFrame.from_ndarray(np.full((48, 64, 3), 40 * i, np.uint8), format="rgb24")):
                out.mux(p)
        for p in st.encode():
            out.mux(p)
    pr, index = video.scan(mj)
    assert pr.extradata_sha1 == "" and pr.pix_fmt == "yuvj420p" and index.count == 5


def test_workers_fork_only_from_a_process_without_other_threads(small_v21, tmp_path):
    """A worker forked while another thread imports a module hangs on that module's lock (the CLI validates and
    hashes on threads; a Prefect worker runs many): with another thread alive the workers come from a fork
    server, and the conversion is the same."""
    import threading

    from roboloop.datasets import convert as conv
    from roboloop.hashing import dir_md5

    cfg = ConvertConfig(progress=False, num_workers=2, **CAPS)
    with conv._worker_pool(2) as pool:  # (tqdm's monitor thread, once started, makes it a fork server too)
        expected = "fork" if threading.active_count() == 1 else "forkserver"
        assert pool._mp_context.get_start_method() == expected  # type: ignore[attr-defined]
    single = convert(small_v21, tmp_path / "single", cfg)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        with conv._worker_pool(2) as pool:
            assert pool._mp_context.get_start_method() == "forkserver"  # type: ignore[attr-defined]
        threaded = convert(small_v21, tmp_path / "threaded", cfg)
    finally:
        stop.set()
        other.join()
    with conv.workers_forked_now(2):  # the CLI's way: fork first, then start threads
        other = threading.Thread(target=lambda: None)
        other.start()
        other.join()
        preforked = convert(small_v21, tmp_path / "preforked", cfg)
    assert dir_md5(single) == dir_md5(threaded) == dir_md5(preforked)
