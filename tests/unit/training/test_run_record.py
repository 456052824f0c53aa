"""Every training run records what ran (precision requested and used, FP8 linears and threshold, attention kernel
and why, device, versions): in metrics.jsonl's first row, the model folder's policy.json, the receipt and the
lineage, and as one line in the loop's summary."""

from __future__ import annotations

import json

from roboloop import stages
from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.summary import run_line
from roboloop.training.config import TrainConfig
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
    assert json.loads((out / "policy.json").read_text())["runtime"] == rec
    ref = stages.model_ref(out, dataset_md5="x")
    assert ref.metrics["run"]["precision"] == "fp32"  # the lineage's metrics are the receipt's
    line = run_line(ref.metrics["run"])
    assert line.startswith("precision fp32 (auto: CPU -> fp32); attention sdpa") and line.endswith("device cpu")
