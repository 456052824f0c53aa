"""`compile`: the VLA's blocks under torch.compile (inductor's C++ backend here) train as eager does, without graph
breaks, and packed batches of changing length do not recompile them; what `auto` decides, and what `on` refuses."""

from __future__ import annotations

import json

import pytest

from roboloop.training import checkpoint, compiled
from roboloop.training.config import TrainConfig
from roboloop.training.train import train
from tests.unit.training.conftest import kill9_at_step

OVERRIDES = {"image_size": [32, 32], "horizon": 8}


def _cfg(ds, out, **kw) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), max_tokens=1024, lr=2e-3, warmup_steps=10,
                checkpoint_every_steps=0, model_overrides=OVERRIDES)
    return TrainConfig(**{**base, **kw})


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_auto_compiles_only_where_measured_faster_and_on_is_refused_where_it_cannot_run(monkeypatch):
    assert compiled.plan("off", "vla", "cpu", True) == (False, "off: eager")
    assert compiled.plan("on", "vla", "cpu", True)[0] and compiled.plan("on", "act", "cpu", True)[0]
    with pytest.raises(ValueError, match="mine has no blocks roboloop compiles"):
        compiled.plan("on", "mine", "cpu", False)
    on, why = compiled.plan("auto", "act", "cpu", True)  # measured slower here: eager, and the figure is given
    assert not on and "1.00x" in why
    monkeypatch.setattr(compiled, "MEASURED", {})
    on, why = compiled.plan("auto", "vla", "cpu", True)
    assert not on and "no bench/compile.py measurement" in why
    monkeypatch.setattr(compiled, "MEASURED", {("vla", "cpu"): (1.05, "here")})
    on, why = compiled.plan("auto", "vla", "cpu", True)
    assert not on and "1.05x" in why
    monkeypatch.setattr(compiled, "MEASURED", {("vla", "cpu"): (1.4, "here")})
    assert compiled.plan("auto", "vla", "cpu", True)[0] and not compiled.plan("auto", "vla", "cuda", True)[0]


@pytest.mark.slow
def test_compiled_blocks_train_as_eager_without_graph_breaks_or_recompiles(tiny_v3, tmp_path):
    """50 packed steps (batches of 1 to 3 episodes' frames: every token count differs)."""
    steps = 50
    train(_cfg(tiny_v3, tmp_path / "eager", steps=steps, compile="off"))
    train(_cfg(tiny_v3, tmp_path / "compiled", steps=steps, compile="on"))
    eager, comp = _rows(tmp_path / "eager"), _rows(tmp_path / "compiled")
    assert eager[0]["run"]["compile"]["compiled"] is False
    rec = comp[0]["run"]["compile"]
    assert rec["compiled"] and rec["regions"] == 4 and rec["block_types"] == 2, rec  # tiny: 2 backbone + 2 head
    gap = max(abs(a["loss"] - b["loss"]) for a, b in zip(eager, comp, strict=True))
    assert gap <= 1e-3, [(a["loss"], b["loss"]) for a, b in zip(eager, comp, strict=True)][-5:]
    last = comp[-1]["compile"]
    assert last["graph_breaks"] == 0, comp[-1]
    assert last["recompiles"] <= 2, comp[-1]  # dynamic shapes: new lengths reuse the blocks' graphs
    assert last["recompiles"] == comp[steps // 2]["compile"]["recompiles"]  # none in the second half
    info = json.loads((tmp_path / "compiled" / "policy.json").read_text())  # the model folder says what ran
    assert info["train"]["compile"] == "on" and info["runtime"]["compile"]["graphs"] == last["graphs"]


@pytest.mark.slow
def test_kill9_then_resume_in_compiled_mode_matches_uninterrupted(tiny_v3, tmp_path):
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    steps = 16  # kept short: each of the three processes compiles the blocks
    train(_cfg(tiny_v3, ref, steps=steps, checkpoint_every_steps=8, compile="on"))
    cfg = _cfg(tiny_v3, killed, steps=steps, checkpoint_every_steps=8, compile="on")
    kill9_at_step(cfg, 9)
    assert checkpoint.latest(killed / "checkpoints").name == "step-00000008"
    assert train(cfg).resumed_from == 8
    assert [r["loss"] for r in _rows(killed)] == [r["loss"] for r in _rows(ref)]  # bit for bit


@pytest.mark.gpu
def test_compiled_bf16_blocks_train_on_cuda_as_eager_does(tiny_v3, tmp_path):
    """The GPU default (precision auto -> bf16 autocast) with compiled blocks: the same losses as eager within bf16's
    rounding, no graph breaks, no recompiles past the first packed shapes."""
    steps = 40
    train(_cfg(tiny_v3, tmp_path / "eager", steps=steps, compile="off", device="cuda"))
    train(_cfg(tiny_v3, tmp_path / "compiled", steps=steps, compile="on", device="cuda"))
    eager, comp = _rows(tmp_path / "eager"), _rows(tmp_path / "compiled")
    assert comp[0]["run"]["precision"] == "bf16" and comp[0]["run"]["compile"]["compiled"]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(eager, comp, strict=True)) <= 0.05
    assert comp[-1]["compile"]["graph_breaks"] == 0 and comp[-1]["compile"]["recompiles"] <= 2, comp[-1]
