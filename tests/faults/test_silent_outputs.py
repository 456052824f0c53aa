"""Never write what you would refuse to read; never trust what you did not check."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roboloop.datasets.convert import ConversionCheckError, ConvertConfig, convert
from tests.faults.conftest import ROOT, assert_no_debris, one_line_error, run_cli, tree_hash


def _faststart_cut(path, fraction=0.6):
    tmp = path.with_suffix(".fs.mp4")
    with av.open(str(path)) as inp, av.open(str(tmp), "w", options={"movflags": "faststart"}) as out:
        st = inp.streams.video[0]
        o = out.add_stream_from_template(st, opaque=True)
        for packet in inp.demux(st):
            if packet.dts is not None:
                packet.stream = o
                out.mux(packet)
    data = tmp.read_bytes()
    tmp.unlink()
    path.write_bytes(data[: int(len(data) * fraction)])


def test_truncated_faststart_mp4_is_caught_before_conversion(v21_dataset, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(v21_dataset, src)
    victim = sorted(src.glob("videos/*/*/*.mp4"))[2]
    _faststart_cut(victim)
    before = tree_hash(src)
    r = run_cli("validate", src)
    assert r.code == 1 and "truncated video" in r.out and victim.name in r.out
    r = run_cli("convert", src, tmp_path / "out")
    assert r.code == 1 and "truncated video" in r.err and "nothing was written" in r.err
    assert not (tmp_path / "out").exists() and tree_hash(src) == before
    assert_no_debris(tmp_path)


def test_non_finite_actions_are_a_defect_naming_episode_frame_and_column(v21_dataset, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(v21_dataset, src)
    p = src / "data/chunk-000/episode_000001.parquet"
    t = pq.read_table(p)
    vals = np.asarray(t["action"].to_pylist(), dtype=np.float32)
    vals[4, 2] = np.nan
    pq.write_table(t.set_column(t.column_names.index("action"), "action",
                                pa.FixedSizeListArray.from_arrays(pa.array(vals.ravel()), vals.shape[1])), p)
    r = run_cli("validate", src)
    assert r.code == 1 and "non_finite" in r.out and "episode 1" in r.out and "frame 4, dim 2" in r.out
    assert "field action" in r.out
    assert run_cli("convert", src, tmp_path / "out").code == 1 and not (tmp_path / "out").exists()


def test_output_that_fails_its_own_check_is_never_published(v21_dataset, tmp_path, monkeypatch):
    """A converter bug (simulated: the video stream copy drops the last packets) is caught before the rename."""
    from roboloop.datasets import convert as convert_mod
    from roboloop.datasets import video

    real = video.concat_videos

    def lossy(inputs, output):
        spans = real(inputs, output)
        data = Path(output).read_bytes()
        Path(output).write_bytes(data[: int(len(data) * 0.7)])
        return spans

    monkeypatch.setattr(convert_mod, "write_video_file", lambda srcs, dst: lossy(srcs, dst))
    with pytest.raises(ConversionCheckError, match="nothing was published"):
        convert(v21_dataset, tmp_path / "out", ConvertConfig(progress=False, workers=1))
    assert not (tmp_path / "out").exists()
    assert_no_debris(tmp_path)


def test_champion_with_impossible_eval_is_named_and_does_not_block_promotion(registry, tmp_path):
    lin = registry.store.root / "reach-vla/versions/v000002/lineage.json"  # v2 is the champion
    doc = json.loads(lin.read_text())
    doc["eval"] = {"successes": 80, "episodes": 50}
    lin.write_text(json.dumps(doc))
    r = run_cli("registry", "list", "reach-vla", "--registry", registry.uri)
    assert r.code == 0 and "successes=80, episodes=50" in r.out
    from tests.faults.conftest import lineage

    v3 = registry.register("reach-vla", registry.store.root / "reach-vla/versions/v000001/files", lineage(1, 10))
    r = run_cli("registry", "promote", "reach-vla", str(v3), "--registry", registry.uri)
    assert r.code == 0, r.text
    decision = json.loads(r.out)
    assert decision["promoted"] and "champion v2 is unusable" in decision["reason"]
    r = run_cli("registry", "show", "reach-vla", "2", "--registry", registry.uri)
    one_line_error(r, "v2", "eval report is inconsistent")


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_outputs_get_the_umasks_permissions(v21_dataset, tmp_path, mask):
    code = ("import os, sys; os.umask(int(sys.argv[3])); from roboloop.cli import main; "
            "sys.exit(main(['convert', sys.argv[1], sys.argv[2], '--no-progress']))")
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-c", code, str(v21_dataset), str(out), str(mask)], check=True, cwd=ROOT,
                   capture_output=True)
    for p in [out, *out.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        want = (0o777 if p.is_dir() else 0o666) & ~mask
        assert mode == want, f"{p.relative_to(tmp_path)}: {oct(mode)} != {oct(want)}"


def test_a_trained_model_gets_the_umasks_permissions(v3_dataset, tmp_path):
    """safetensors writes its file 0600: a model only its writer can read cannot be served or shared."""
    from roboloop.training.config import TrainConfig
    from roboloop.training.train import train

    old = os.umask(0o022)
    try:
        train(TrainConfig(dataset=str(v3_dataset), output_dir=str(tmp_path / "m"), steps=2, max_tokens=512,
                          model_overrides={"image_size": [32, 32], "horizon": 8}, checkpoint_every_steps=0))
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "m").iterdir() if p.is_file()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, {k: oct(v) for k, v in modes.items()}


def test_registry_download_and_files_follow_the_umask(registry, tmp_path):
    old = os.umask(0o022)
    try:
        dst = registry.download("reach-vla", "1", tmp_path / "dl")
    finally:
        os.umask(old)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in dst.rglob("*") if p.is_file()}
    assert modes == {0o644}, [oct(m) for m in modes]
    reg_files = {stat.S_IMODE(p.stat().st_mode) for p in registry.store.root.rglob("*.json")}
    assert 0o600 not in reg_files
