"""`roboloop registry add`: a model trained outside the loop enters the registry with the lineage that can be read
from its folder, and is promoted only through the gate (`stages.register`)."""

from __future__ import annotations

from pathlib import Path

from roboloop.evaluation.config import OfflineRecipe
from roboloop.lineage import Lineage, eval_record
from roboloop.receipts import Decision, EvalSummary
from roboloop.stages import dataset_ref, evaluate_offline, model_ref, register


def register_folder(path: str | Path, name: str, registry: str | None = None, evaluation: str | Path | None = None,
                    promote: bool = False, margin: float = 0.05, dataset: str | Path | None = None,
                    score_offline: str | None = None) -> Decision:
    """`roboloop registry add`: a model folder trained outside the loop, registered with the lineage that can be
    read from it (its config, metrics, the dataset it names, this checkout's commit) and, with `evaluation` (a
    `roboloop evaluate --output-dir` run folder), that evaluation for the gate. Promoted only when asked, and
    then only through the gate."""
    from roboloop.policies import model_info

    model = model_ref(path, dataset_md5="")
    if dataset and not (Path(dataset) / "meta" / "info.json").is_file():
        raise FileNotFoundError(f"{dataset}: not a dataset folder (no meta/info.json): pass the dataset the model "
                                "was trained on with --dataset, or leave it out")
    dataset = dataset or (model.config or {}).get("dataset")  # the one its config names, if it is still there
    data = dataset_ref(dataset) if dataset and (Path(dataset) / "meta" / "info.json").is_file() else None
    model = model.model_copy(update={"dataset_md5": data.md5 if data else ""})
    ev = None
    if evaluation is not None:
        run = Path(evaluation)
        if not (run / "summary.json").is_file():
            raise FileNotFoundError(f"{run}: no summary.json; pass the --output-dir of a `roboloop evaluate` run")
        ev = EvalSummary.model_validate_json((run / "summary.json").read_text())
        if ev.policy_id != model.weights_sha256:
            raise ValueError(f"{run} evaluated other weights ({ev.policy_id[:12]}) than {path} "
                             f"({model.weights_sha256[:12]})")
    offline = None
    if score_offline:  # scored on the dataset now, recorded for the (paired, offline) gate
        if data is None:
            raise ValueError("--score-offline needs the dataset the model was trained on (--dataset)")
        from roboloop.datasets.meta import load_meta

        eps = None if score_offline == "validation" else [e.episode_index for e in load_meta(data.path).episodes]
        offline = evaluate_offline(model, data, OfflineRecipe(), episodes=eps)
    lin = Lineage(dataset=data, model=model, evaluation=ev, dataset_md5=data.md5 if data else "unknown",
                  family=model.family,
                  config={"registered_from": str(Path(path).absolute()), "train": model.config,
                          "unknown": model_info(path).notes},
                  seed=int(model.config.get("seed", 0)), metrics={**model.metrics, "weights_sha256":
                                                                 model.weights_sha256},
                  eval=eval_record(ev) if ev else None, offline=offline,
                  offline_eval=offline.gate_record() if offline else None)
    return register(model, lin, name, registry, margin, promote=promote)
