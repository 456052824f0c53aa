"""Checkpoints carry checksums: changed bytes are never resumed, the newest intact one is, and a truncated one is
named instead of surfacing torch's zip error."""

from __future__ import annotations

import json

import pytest
import torch

from roboloop.errors import CorruptFileError, DiskFullError
from roboloop.training import checkpoint


def _three(tmp_path):
    d = tmp_path / "checkpoints"
    for step in (10, 20, 30):
        checkpoint.save(d, step, {"step": step, "w": torch.full((64, 64), float(step))}, keep_last=3)
    return d


def test_flipped_bytes_fall_back_to_the_newest_intact_checkpoint(tmp_path, caplog):
    d = _three(tmp_path)
    assert checkpoint.latest(d).name == "step-00000030"
    state = d / "step-00000030" / "state.pt"
    data = bytearray(state.read_bytes())
    for i in range(100):  # 100 flipped bytes, same size
        data[1000 + i] ^= 0xFF
    state.write_bytes(bytes(data))
    with caplog.at_level("WARNING"):
        found = checkpoint.latest(d)
    assert found.name == "step-00000020" and checkpoint.load(found)["step"] == 20
    assert "step-00000030/state.pt does not match its recorded sha256" in caplog.text


def test_all_damaged_is_an_error_naming_the_file_and_old_checkpoints_still_load(tmp_path):
    d = _three(tmp_path)
    for step in (10, 20, 30):
        p = d / f"step-{step:08d}" / "state.pt"
        p.write_bytes(p.read_bytes()[:500])
    with pytest.raises(CorruptFileError, match="step-00000030/state.pt"):
        checkpoint.latest(d)
    with pytest.raises(CorruptFileError, match=r"state.pt cannot be read"):
        checkpoint.load(d / "step-00000030")
    old = d / "step-00000010"  # written before checksums existed: trusted as before
    checkpoint.save(tmp_path / "old", 5, {"step": 5}, keep_last=1)
    meta = tmp_path / "old" / "step-00000005" / "meta.json"
    meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != "files"}))
    assert checkpoint.latest(tmp_path / "old").name == "step-00000005" and old.exists()


def test_a_full_disk_during_a_checkpoint_is_named(tmp_path, monkeypatch):
    def full(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 1234 vs 1200")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(DiskFullError, match="checkpoint .*step-00000010"):
        checkpoint.save(tmp_path / "c", 10, {"x": 1}, keep_last=2)
    assert not list((tmp_path / "c").iterdir())  # nothing half-written left
