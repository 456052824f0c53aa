"""Every training run records what ran (precision requested and used, FP8 linears and threshold, attention kernel
and why, device, versions): in metrics.jsonl's first row, the model folder's policy.json, the receipt and the
lineage, and as one line in the loop's summary."""

from __future__ import annotations

import json
import math

import pytest

from roboloop import availability, stages
from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.loop.summary import training_line
from roboloop.training.config import TrainConfig
from roboloop.training.runline import run_line
from roboloop.training.train import train


def test_the_run_record_reaches_metrics_the_model_folder_and_the_receipt(small_v21, tmp_path):
    v3 = convert(small_v21, tmp_path / "v3", ConvertConfig(progress=False, workers=1))
    out = tmp_path / "run"
    train(TrainConfig(dataset=str(v3), output_dir=str(out), steps=2, max_tokens=512, checkpoint_every_steps=0,
                      model_overrides={"image_size": [32, 32]}))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rec = rows[0]["run"]
    assert "run" not in rows[1]
    assert (rec["precision_requested"], rec["precision"], rec["fp8_linears"]) == ("auto", "fp32", 0)
    assert rec["attention"] == "sdpa" and "not on CUDA" in rec["attention_reason"]
    assert rec["device"] == "cpu" and rec["torch"] and rec["fp8_min_features"] == 1024
    assert rec["optimizer"] == "AdamW, fused kernel"  # roboloop.training.optim: every parameter takes it here
    assert json.loads((out / "policy.json").read_text())["runtime"] == rec
    ref = stages.model_ref(out, dataset_md5="x")
    assert ref.metrics["run"]["precision"] == "fp32"  # the lineage's metrics are the receipt's
    line = run_line(ref.metrics["run"])
    assert line.startswith("precision fp32 (auto: CPU -> fp32); attention sdpa") and line.endswith("device cpu")
    # the frame cache's word: this split's frames fit the default budget, so each is decoded once
    assert rec["frame_cache"]["decoded_once"] and rec["frame_cache"]["frame_cache_mb"] == 2048
    # the wall clock: every row's seconds since the run started building, the summary's minutes
    assert 0 < rows[0]["elapsed_s"] <= rows[1]["elapsed_s"]
    assert ref.metrics["train_s"] == round(rows[1]["elapsed_s"], 1)
    assert training_line(ref.metrics) == f"2 steps in {rows[1]['elapsed_s'] / 60:.1f} min; {line}"


def test_a_resumed_runs_wall_clock_is_the_sum_of_its_starts(tmp_path):
    from roboloop.training.metrics import summary

    rows = [{"step": 1, "loss": 1.0, "samples_per_s": 1.0, "elapsed_s": 10.0, "run": {"precision": "fp32"}},
            {"step": 2, "loss": 1.0, "samples_per_s": 1.0, "elapsed_s": 20.0},  # killed here, resumed from step 2
            {"step": 3, "loss": 1.0, "samples_per_s": 1.0, "elapsed_s": 5.0, "run": {"precision": "fp32"}},
            {"step": 4, "loss": 1.0, "samples_per_s": 1.0, "elapsed_s": 7.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert summary(tmp_path)["train_s"] == 27.5
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "elapsed_s"})
                                                    + "\n" for r in rows))
    assert "train_s" not in summary(tmp_path)  # a folder from before the clock was recorded: no number made up


@pytest.mark.skipif(availability.cpu_bf16() is None, reason="this CPU has no native bf16 (AMX or AVX512-BF16)")
def test_the_vla_trains_in_bf16_on_a_cpu_that_has_it(small_v21, tmp_path):
    v3 = convert(small_v21, tmp_path / "v3", ConvertConfig(progress=False, workers=1))
    out = tmp_path / "run"
    train(TrainConfig(dataset=str(v3), output_dir=str(out), steps=2, max_tokens=512, checkpoint_every_steps=0,
                      precision="bf16", model_overrides={"image_size": [32, 32]}))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rec = rows[0]["run"]
    assert rec["precision"] == "bf16" and "CPU autocast" in rec["precision_reason"]
    assert all(math.isfinite(r["loss"]) for r in rows)
