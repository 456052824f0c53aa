"""`roboloop reproduce NAME@VERSION`: rerun the loop from a registered model's lineage.

Reads lineage.json (raw and v3 dataset md5s, convert/train/eval configs, seed), checks that
the raw dataset here still has the recorded md5, converts, trains and evaluates again into
`artifacts/reproduce/NAME-vN/`, and reports, stage by stage, whether the new outputs match the
recorded ones (dataset md5s, model weights hash, final loss, success rate).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

from roboloop import dvc
from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.evaluation.run import EvalConfig, evaluate_in_subprocess
from roboloop.registry import Registry
from roboloop.training.config import TrainConfig
from roboloop.training.launch import LaunchConfig, run_torchrun


def reproduce(ref: str, registry: str | None = None, out_root: str | Path = "artifacts/reproduce",
              loss_tol: float = 1e-6, on_line=print) -> dict:
    name, _, r = ref.partition("@")
    reg = Registry(registry)
    v = reg.resolve(name, r or "champion")
    lin = reg.lineage(name, v)
    cfg = lin["config"]
    out = Path(out_root).resolve() / f"{name}-v{v}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    source = Path(cfg.get("source", "data")).resolve()
    checks: dict[str, dict] = {}
    raw_md5 = dvc.track(source, push=False).md5
    checks["raw_dataset_md5"] = {"recorded": lin.get("raw_dataset_md5"), "now": raw_md5}
    if lin.get("raw_dataset_md5") and raw_md5 != lin["raw_dataset_md5"]:
        raise ValueError(f"{source} has md5 {raw_md5}, lineage recorded {lin['raw_dataset_md5']}: "
                         "check out the recorded data first (git checkout <commit> data.dvc && dvc pull)")
    v3 = convert(source, out / "dataset_v3", ConvertConfig(**{**cfg["convert"], "progress": False}))
    checks["dataset_md5"] = {"recorded": lin["dataset_md5"], "now": dvc.track(v3, push=False).md5}
    train_cfg = TrainConfig(**{**cfg["train"], "dataset": str(v3), "output_dir": str(out / "model"),
                               "resume": False})
    model = run_torchrun(train_cfg, LaunchConfig(), on_line=on_line)
    rows = [json.loads(x) for x in (model / "metrics.jsonl").read_text().splitlines() if x.strip()]
    checks["final_loss"] = {"recorded": lin["metrics"].get("final_loss"), "now": rows[-1]["loss"]}
    checks["weights_sha256"] = {"recorded": lin["metrics"].get("weights_sha256"),
                                "now": hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()}
    # The folder's DVC md5 also covers paths and timings (config.json, metrics.jsonl): reported, not compared.
    model_md5 = {"recorded": lin.get("model_md5"), "now": dvc.track(model, push=False).md5}
    if lin.get("eval"):
        ev = EvalConfig(**{**cfg["eval"], "policy": str(model), "output_dir": str(out / "eval"), "videos": 0})
        rep = evaluate_in_subprocess(ev, on_line=on_line)
        checks["success_rate"] = {"recorded": lin["eval"]["success_rate"], "now": rep["success_rate"]}
    for key, c in checks.items():
        if key == "final_loss":
            c["match"] = c["recorded"] is not None and math.isclose(c["recorded"], c["now"], abs_tol=loss_tol)
        else:
            c["match"] = c["recorded"] is None or c["recorded"] == c["now"]
    report = {"model": f"{name}@v{v}", "git_commit_recorded": lin.get("git_commit"), "output": str(out),
              "checks": checks, "model_folder_md5": model_md5, "match": all(c["match"] for c in checks.values())}
    (out / "reproduce.json").write_text(json.dumps(report, indent=2))
    return report
