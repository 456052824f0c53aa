"""FP8 under the compiler, on this CPU: torchao's float8 training in emulation (its casts and scales as on a GPU, the
GEMMs in fp32: this CPU has no FP8 GEMM) inside the VLA's compiled blocks (tensorwise; rowwise eager), through the
trainer. What it checks is what a GPU run relies on and a CPU can show: the converted linears trace into the
blocks' graphs without a graph break, compiled FP8 trains as eager FP8 does, and both stay near fp32. What it
cannot show is the speed: `make gpu-check` measures that (FP8 compiled vs bf16 compiled at base and n15)."""

from __future__ import annotations

import functools
import json

import pytest

from roboloop import availability
from roboloop.training import precision
from roboloop.training.config import TrainConfig
from roboloop.training.train import train

OVERRIDES = {"image_size": [32, 32], "horizon": 8}
STEPS = 12


@pytest.fixture
def emulated_fp8(monkeypatch):
    """FP8 on this CPU: torchao's emulation, and a threshold the tiny preset's 64-wide linears reach."""
    monkeypatch.setattr(availability, "require_fp8", lambda _backend: None)
    monkeypatch.setattr(precision, "apply_fp8", functools.partial(precision.apply_fp8, emulate=True))
    monkeypatch.setattr(precision, "FP8_MIN_FEATURES", 64)


def _run(ds, out, **kw) -> list[dict]:
    train(TrainConfig(dataset=str(ds), output_dir=str(out), max_tokens=1024, lr=2e-3, warmup_steps=5, steps=STEPS,
                      checkpoint_every_steps=0, model_overrides=OVERRIDES, **kw))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_fp8_trains_inside_the_compiled_blocks_as_eager_fp8_does(tiny_v3, tmp_path, emulated_fp8):
    """Tensorwise compiled against eager and fp32; rowwise eager against fp32 (rowwise inside the compiled blocks is
    the gpu test's: a second compile here cost make test ~50 s for the same trace)."""
    fp32 = _run(tiny_v3, tmp_path / "fp32", precision="fp32", compile="off")
    eager = _run(tiny_v3, tmp_path / "eager", precision="fp8", fp8_recipe="tensorwise", compile="off")
    comp = _run(tiny_v3, tmp_path / "compiled", precision="fp8", fp8_recipe="tensorwise", compile="on")
    rows = _run(tiny_v3, tmp_path / "rowwise", precision="fp8", fp8_recipe="rowwise", compile="off")
    for recipe, out in (("tensorwise", comp), ("rowwise", rows)):
        run = out[0]["run"]
        assert run["precision"] == "fp8" and run["fp8_recipe"] == recipe and run["fp8_linears"] >= 8, run
    assert comp[0]["run"]["compile"]["compiled"] and comp[-1]["compile"]["graph_breaks"] == 0, comp[-1]
    loss = {name: [r["loss"] for r in out] for name, out in
            (("fp32", fp32), ("eager", eager), ("comp", comp), ("rowwise", rows))}
    # compiled FP8 = eager FP8 up to the order of fp32 sums (the casts and scales are the same arithmetic)
    assert max(abs(a - b) / a for a, b in zip(loss["eager"], loss["comp"], strict=True)) <= 1e-2, loss
    for name in ("comp", "rowwise"):  # FP8 (e4m3 forward, e5m2 gradients) near fp32 over the run, and it learns
        assert max(abs(a - b) / a for a, b in zip(loss["fp32"], loss[name], strict=True)) <= 0.1, (name, loss)
        assert loss[name][-1] < loss[name][0] * 0.8, (name, loss)


def test_another_recipe_than_tensorwise_is_refused_where_it_would_do_nothing():
    with pytest.raises(ValueError, match="fp8_recipe='rowwise' would do nothing: precision=bf16 never trains in FP8"):
        TrainConfig(dataset="d", output_dir="o", precision="bf16", fp8_recipe="rowwise")
    with pytest.raises(ValueError, match="Transformer Engine"):
        TrainConfig(dataset="d", output_dir="o", precision="fp8", fp8_backend="te", fp8_recipe="rowwise")
    assert TrainConfig(dataset="d", output_dir="o", precision="auto", fp8_recipe="rowwise").fp8_recipe == "rowwise"


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_compiled_on_the_gpu_trains_near_bf16(tiny_v3, tmp_path, monkeypatch, recipe):
    """Real FP8 GEMMs (no emulation) inside the compiled blocks, against compiled bf16; rowwise needs an H100."""
    import torch

    if not availability.fp8_hardware():
        pytest.skip("needs compute capability >= 8.9")
    if recipe == "rowwise" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("rowwise scaling needs compute capability 9.0")
    monkeypatch.setattr(precision, "FP8_MIN_FEATURES", 64)
    bf16 = _run(tiny_v3, tmp_path / "bf16", precision="bf16", compile="on", device="cuda")
    fp8 = _run(tiny_v3, tmp_path / "fp8", precision="fp8", fp8_recipe=recipe, compile="on", device="cuda")
    run = fp8[0]["run"]
    assert run["precision"] == "fp8" and run["fp8_recipe"] == recipe and run["fp8_linears"] >= 8, run
    assert fp8[-1]["compile"]["graph_breaks"] == 0, fp8[-1]
    assert max(abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(bf16, fp8, strict=True)) <= 0.1
