"""`roboloop reproduce NAME@VERSION`: rerun the stages from a registered version's lineage and compare.

The lineage holds the receipts of every stage (raw dataset, v3 dataset, model, evaluation) and
their configs. Reproducing is the same stages again, into `artifacts/reproduce/NAME-vN/`, from
the raw dataset here (which must have the recorded md5), and a stage-by-stage comparison: v3
dataset md5, weights sha256, final loss, success rate (a version the loop picked among a run's
checkpoints, `LoopConfig.select`, with the rerun's checkpoint of that step). The model folder's md5 is
reported, not compared: it also covers timings (metrics.jsonl).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from roboloop import fsutil, stages
from roboloop.datasets.config import ConvertConfig
from roboloop.evaluation.config import EvalRecipe
from roboloop.lineage import Lineage
from roboloop.registry import Registry
from roboloop.training.config import LaunchConfig, TrainRecipe


def _fresh_dir(out: Path) -> Path:
    """Our own folder for this reproduction; an earlier one is moved aside, anything else refused."""
    if out.exists():
        fsutil.check_destination(out, "reproduction", overwrite=True, flag="--out")
        fsutil.publish(fsutil.make_dir(fsutil.temp_sibling(out)), out, "reproduction", overwrite=True)
    out.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_json(out / fsutil.MARKER, {"created_by": "roboloop", "kind": "reproduction"})
    return out


def reproduce(ref: str, registry: str | None = None, out_root: str | Path | None = None,
              loss_tol: float = 1e-6, on_line=print) -> dict[str, Any]:
    name, _, r = ref.partition("@")
    reg = Registry(registry)
    v = reg.resolve(name, r or "champion")
    lin = Lineage.model_validate(reg.lineage(name, v))
    if lin.model is None or lin.dataset is None:
        raise ValueError(f"{name} v{v} was registered before lineages carried receipts; it cannot be reproduced")
    out = _fresh_dir(Path(out_root or stages.artifacts_root() / "reproduce").absolute() / f"{name}-v{v}")
    source = lin.raw.source if lin.raw and lin.raw.source else lin.config.get("source", "data")
    raw = stages.dataset_ref(source, source=source)
    checks: dict[str, dict[str, Any]] = {"raw_dataset_md5": {"recorded": lin.raw_dataset_md5, "now": raw.md5}}
    if lin.raw_dataset_md5 and raw.md5 != lin.raw_dataset_md5:
        raise ValueError(f"{source} has md5 {raw.md5}, lineage recorded {lin.raw_dataset_md5}: check out the "
                         "recorded data first (git checkout <commit> data.dvc && dvc pull)")
    data = stages.convert(raw, ConvertConfig(**{**lin.config["convert"], "progress": False}), dst=out / "dataset_v3")
    checks["dataset_md5"] = {"recorded": lin.dataset.md5, "now": data.md5}
    recipe = TrainRecipe(**{k: val for k, val in lin.model.config.items() if k in TrainRecipe.model_fields})
    model = stages.train(data, recipe, LaunchConfig(), output_dir=out / "model", execution=lin.model.execution,
                         on_line=on_line)
    picked = (lin.config.get("select") or {}).get("picked_step")
    if picked is not None and picked != recipe.steps:  # the loop carried a kept checkpoint on (LoopConfig.select)
        from roboloop.training.kept import export_checkpoint, kept_checkpoints

        ckpt = dict(kept_checkpoints(model.path)).get(picked)
        if ckpt is None:
            raise ValueError(f"{name} v{v} is step {picked}'s checkpoint and the rerun kept no checkpoint of that step")
        model = stages.model_ref(export_checkpoint(model.path, ckpt, picked, out / f"model-step{picked:08d}"),
                                 data.md5, lin.model.execution)
        checks["picked_step"] = {"recorded": picked, "now": picked}
    else:
        checks["final_loss"] = {"recorded": lin.model.metrics.get("final_loss"),
                                "now": model.metrics.get("final_loss")}
    checks["weights_sha256"] = {"recorded": lin.model.weights_sha256, "now": model.weights_sha256}
    if lin.evaluation is not None:
        ev = stages.evaluate(model, EvalRecipe(**{**lin.config["eval"], "videos": 0}), runs_root=out / "evals",
                             on_line=on_line)
        checks["success_rate"] = {"recorded": lin.evaluation.success_rate, "now": ev.success_rate}
    for key, c in checks.items():
        if key == "final_loss":
            c["match"] = c["recorded"] is not None and c["now"] is not None and \
                math.isclose(c["recorded"], c["now"], abs_tol=loss_tol)
        else:
            c["match"] = c["recorded"] is None or c["recorded"] == c["now"]
    report = {"model": f"{name}@v{v}", "git_commit_recorded": lin.git_commit, "output": str(out), "checks": checks,
              "model_folder_md5": {"recorded": lin.model.md5, "now": model.md5},
              "match": all(c["match"] for c in checks.values())}
    fsutil.atomic_write_json(out / "reproduce.json", report)
    return report
