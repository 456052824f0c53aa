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


class _Payload:
    """What a planted checkpoint pickles: unpickling it would run `touch MARK`."""

    def __init__(self, mark):
        self.mark = str(mark)

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.mark}",)


@pytest.mark.parametrize("how", ["inside a real checkpoint", "a bare pickle"])
def test_a_planted_pickle_with_good_checksums_runs_nothing_and_is_refused_as_untrusted(tmp_path, how):
    """meta.json's checksums are written by whoever wrote the folder: they prove nothing about its author. A pickle
    that asks for any object but tensors and plain values is refused by name, and its command never runs."""
    import pickle

    from roboloop.errors import UntrustedFileError

    d, mark = tmp_path / "checkpoints", tmp_path / "ran"
    checkpoint.save(d, 10, {"step": 10, "w": torch.ones(3)}, keep_last=2)
    planted = d / "step-00000990"
    planted.mkdir()
    if how == "a bare pickle":
        (planted / "state.pt").write_bytes(pickle.dumps({"step": 990, "model": _Payload(mark)}))
    else:  # torch's own zip format, a payload beside real tensors
        torch.save({"step": 990, "w": torch.ones(3), "x": _Payload(mark)}, planted / "state.pt")
    checkpoint._publish(planted, tmp_path / "moved", {"step": 990}, keep_last=5)  # meta.json with its true sha256
    (tmp_path / "moved").rename(planted)
    assert checkpoint.latest(d) == planted  # intact by its checksums
    with pytest.raises(UntrustedFileError, match=r"step-00000990/state.pt asks to build .*system.*untrusted"):
        checkpoint.load(planted)
    assert not mark.exists()


def test_what_a_checkpoint_holds_is_data_and_restores_every_rng(tmp_path):
    import random

    import numpy as np

    rng = checkpoint.rng_state()
    a = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    state = {"step": 3, "rng": rng, "data": {"order": np.arange(5), "epoch": np.int64(2), "seen": (1, 2)}}
    path = checkpoint.save(tmp_path / "c", 3, state, keep_last=1)
    back = checkpoint.load(path)  # weights_only=True inside
    checkpoint.set_rng_state(back["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == a
    assert back["data"]["order"].tolist() == [0, 1, 2, 3, 4] and back["data"]["epoch"] == 2
    with pytest.raises(TypeError, match="tensors and plain types; got a object"):
        checkpoint.save(tmp_path / "d", 1, {"x": object()}, keep_last=1)
