"""The closed loop: ingest -> validate -> convert -> train -> evaluate -> register.

Each stage is a subflow whose tasks are cached on input content (DVC md5) + config + code
version, so a rerun with unchanged inputs finishes in seconds and a changed dataset or
config reruns exactly the stages downstream of the change.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, Field

from flows.convert import ConvertParams, convert_flow
from flows.evaluate import evaluate_flow
from flows.ingest import IngestParams, ingest_flow
from flows.register import RegisterParams, register_flow
from flows.train import TrainParams, train_flow
from roboloop.datasets.convert import ConvertConfig
from roboloop.evaluation.run import CollectConfig, EvalConfig
from roboloop.lineage import Lineage
from roboloop.training.config import TrainConfig
from roboloop.training.launch import LaunchConfig


class ClosedLoopParams(BaseModel):
    source: str = Field("data", description="raw dataset: folder or s3://bucket/prefix")
    collect_if_missing: CollectConfig | None = Field(
        default_factory=lambda: CollectConfig(episodes=128, num_envs=32),
        description="record expert demos when the source folder is missing (embedded defaults)")
    dataset_v3: str = Field("artifacts/dataset_v3", description="converted dataset")
    convert: ConvertConfig = Field(default_factory=ConvertConfig)
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(dataset="artifacts/dataset_v3",
                                                                   output_dir="artifacts/model", steps=1200,
                                                                   checkpoint_every_steps=200))
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    eval: EvalConfig = Field(default_factory=lambda: EvalConfig(episodes=48, num_envs=16, execute_steps=4,
                                                                output_dir="artifacts/eval"))
    baseline: bool = Field(True, description="also evaluate a random policy for comparison")
    model_name: str = Field("reach-vla", description="registry model name")
    registry: str | None = Field(None, description="registry URI; default $ROBOLOOP_REGISTRY or .roboloop/registry")
    margin: float = Field(0.05, ge=0, le=1, description="promotion non-inferiority margin")
    track: bool = Field(True, description="DVC-track every artifact")


@flow(name="closed-loop", log_prints=True)
def closed_loop(params: ClosedLoopParams = ClosedLoopParams()) -> dict:
    raw = ingest_flow(IngestParams(source=params.source, collect_if_missing=params.collect_if_missing,
                                   track=params.track))
    v3 = convert_flow(ConvertParams(src=raw["path"], dst=params.dataset_v3, raw_md5=raw["md5"],
                                    config=params.convert, track=params.track))
    trained = train_flow(TrainParams(train=params.train.model_copy(update={"dataset": v3["path"]}),
                                     launch=params.launch, dataset_md5=v3["md5"], track=params.track))
    out = Path(params.eval.output_dir)
    model_eval = evaluate_flow(params.eval.model_copy(update={"policy": trained["output_dir"],
                                                              "output_dir": str(out / "model")}),
                               policy_md5=trained["model_md5"] or trained["output_dir"])
    baseline = evaluate_flow(params.eval.model_copy(update={"policy": "random", "videos": 1,
                                                            "output_dir": str(out / "random")}),
                             policy_md5="random") if params.baseline else None
    lineage = Lineage(dataset_md5=v3["md5"], raw_dataset_md5=raw["md5"], model_md5=trained["model_md5"],
                      config={"train": params.train.model_dump(mode="json"),
                              "convert": params.convert.model_dump(mode="json"),
                              "eval": params.eval.model_dump(mode="json"), "source": params.source},
                      seed=params.train.seed, metrics=trained, eval=model_eval)
    decision = register_flow(RegisterParams(name=params.model_name, model_dir=trained["output_dir"],
                                            lineage=lineage, registry=params.registry, margin=params.margin))
    summary = {"dataset_v3": v3["path"], "dataset_md5": v3["md5"], "model": trained["output_dir"],
               "model_md5": trained["model_md5"], "final_loss": trained["final_loss"],
               "success_rate": model_eval["success_rate"], "ci": [model_eval["ci_low"], model_eval["ci_high"]],
               "random_success_rate": baseline["success_rate"] if baseline else None,
               "eval_report": str(out / "model" / "report.json"), "registry": decision}
    create_markdown_artifact(_report(summary), key="closed-loop-report", description="closed loop summary")
    return summary


def _report(s: dict) -> str:
    r = s["registry"]
    lines = ["## roboloop closed loop", "", "| stage | result |", "|---|---|",
             f"| dataset | `{s['dataset_v3']}` (md5 `{s['dataset_md5']}`) |",
             f"| model | `{s['model']}` (final loss {s['final_loss']:.4f}) |",
             f"| policy success | **{s['success_rate']:.1%}** (95% CI {s['ci'][0]:.1%}-{s['ci'][1]:.1%}) |"]
    if s["random_success_rate"] is not None:
        lines.append(f"| random policy | {s['random_success_rate']:.1%} |")
    lines.append(f"| registry | `{r['name']}` v{r['version']} in `{r['registry']}`; promoted: {r.get('promoted')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(closed_loop())
