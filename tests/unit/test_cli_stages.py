"""`roboloop convert | ingest | train` are the loop's stages: receipts, verified cache hits, outputs that are gone
or changed are recomputed (never a crash, never a stale answer), DVC tracking on request."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def _cli(cwd: Path, *args) -> dict:
    env = {**os.environ, "ROBOLOOP_CACHE_DIR": str(cwd / "cache"), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "roboloop.cli", *map(str, args)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_convert_twice_is_a_verified_hit_and_a_lost_or_changed_output_is_recomputed(small_v21, tmp_path):
    out = tmp_path / "v3"
    first = _cli(tmp_path, "convert", small_v21, out, "--no-progress", "--workers", "1")
    assert first["format"] == "v3.0" and first["dst"] == str(out) and first["md5"].endswith(".dir")
    before = _mtimes(out)
    second = _cli(tmp_path, "convert", small_v21, out, "--workers", "1")
    assert second == first and _mtimes(out) == before  # a hit: nothing rewritten

    shutil.rmtree(out)  # gone: recomputed, the same dataset
    assert _cli(tmp_path, "convert", small_v21, out, "--workers", "1")["md5"] == first["md5"]

    data = next((out / "data").rglob("*.parquet"))
    data.write_bytes(data.read_bytes()[:-7] + b"garbled")  # changed behind roboloop's back: not trusted
    third = _cli(tmp_path, "convert", small_v21, out, "--workers", "1")
    assert third["md5"] == first["md5"]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("v3") and p != out]
    assert len(aside) == 1  # the changed copy was moved aside, not deleted

    other = _cli(tmp_path, "convert", small_v21, tmp_path / "elsewhere", "--workers", "1")
    assert other["dst"] == str(tmp_path / "elsewhere")  # a hit for another folder is not an answer for this one

    p = subprocess.run([sys.executable, "-m", "roboloop.cli", "convert", out, tmp_path / "again"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)  # a v3.0 source: said, not passed through
    assert p.returncode != 0 and "v3.0 needs no conversion" in p.stderr and not (tmp_path / "again").exists()


def test_ingest_and_train_return_receipts_and_train_twice_is_a_hit(small_v21, tmp_path):
    raw = _cli(tmp_path, "ingest", small_v21)
    assert raw["ok"] and raw["format"] == "v2.1" and raw["num_episodes"] > 0
    v3 = _cli(tmp_path, "convert", small_v21, tmp_path / "v3", "--workers", "1")
    args = ("train", "--dataset", v3["dst"], "--output-dir", tmp_path / "run", "--steps", "3", "--max-tokens", "512",
            "--with-video", "--checkpoint-every-steps", "0")
    first = _cli(tmp_path, *args)
    assert first["family"] == "vla" and first["steps"] == 3 and len(first["weights_sha256"]) == 64
    assert first["dataset_md5"] == v3["md5"]
    before = _mtimes(tmp_path / "run")
    assert _cli(tmp_path, *args) == first and _mtimes(tmp_path / "run") == before


@pytest.mark.slow
def test_track_puts_the_output_under_dvc(small_v21, tmp_path):
    from roboloop import dvc

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    dvc.init_repo(tmp_path, remote=str(tmp_path / ".remote"))
    ref = _cli(tmp_path, "convert", small_v21, tmp_path / "v3", "--workers", "1", "--track")
    assert ref["tracked"] and (tmp_path / "v3.dvc").is_file()


def test_a_long_model_name_keeps_its_step_in_the_evaluation_folder_name():
    from roboloop.stages import slug

    name = "tiny-c4ea821ac2e91701-step00002000"  # a swept checkpoint's model folder
    cut = slug(name, 32, keep_end=True)
    assert len(cut) <= 32 and cut.endswith("step00002000") and cut.startswith("tiny-c4ea821ac2e")
    assert slug(name, 32) == "tiny-c4ea821ac2e91701-step000020"  # the plain cut: reads as step 20
    assert slug("tiny-c4ea821ac2e91701", 32, keep_end=True) == "tiny-c4ea821ac2e91701"  # short names unchanged
    assert slug("A//b", 32, keep_end=True) == "a-b" and slug("///", 8, keep_end=True) == "x"
