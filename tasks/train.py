"""Training task: torchrun in a child process group, its output re-logged line by line."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_image_artifact, create_table_artifact

from roboloop.training.config import TrainConfig
from roboloop.training.launch import LaunchConfig, run_torchrun
from tasks.common import content_key, relay


def _train_key(ctx, params) -> str:
    cfg: TrainConfig = params["cfg"]
    return content_key("train", params["dataset_md5"], cfg.model_dump(exclude={"dataset"}),
                       params["launch"].model_dump(exclude={"rdzv_endpoint", "run_id", "timeout_s"}))


@task(name="train", cache_key_fn=_train_key, persist_result=True)
def train_task(cfg: TrainConfig, launch: LaunchConfig, dataset_md5: str) -> dict:
    """Train (resuming from checkpoints in `cfg.output_dir`); cached on dataset md5 + config + code.

    Cancelling the flow run or hitting `launch.timeout_s` kills torchrun's whole process group.
    """
    owner = Path(cfg.output_dir) / "run_config.json"
    if cfg.resume and owner.exists():
        changed = cfg.changed_fields(json.loads(owner.read_text()))
        if changed:  # the cache said this is a new run: the old checkpoints belong to a superseded one
            get_run_logger().warning("dropping checkpoints of a run with different %s", ", ".join(changed))
            shutil.rmtree(Path(cfg.output_dir) / "checkpoints", ignore_errors=True)
    out = run_torchrun(cfg, launch, on_line=relay("[train] "))
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines() if r.strip()]
    last = rows[-1]
    summary = {"output_dir": str(out), "steps": last["step"], "first_loss": rows[0]["loss"],
               "final_loss": last["loss"], "samples_per_s": round(sum(r["samples_per_s"] for r in rows[-20:])
                                                                   / min(20, len(rows)), 1),
               "data_wait_fraction": round(last["data_wait_fraction"], 3), "mfu": last.get("mfu"),
               # the weights alone: the folder's md5 also covers paths and timings (config.json, metrics.jsonl)
               "weights_sha256": hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()}
    create_table_artifact([summary], key="train-summary", description=f"{cfg.preset} on {Path(cfg.dataset).name}")
    create_image_artifact((out / "loss.png").resolve().as_uri(), key="train-loss", description="loss curve")
    return summary
