"""Lineage: what produced an artifact (code, data, config, seed, packages) and how to rerun it.

Every stage records a `Lineage` next to its output; the registry refuses a version without
one. `reproduce()` reruns the loop from a registered version's lineage (same dataset md5,
same configs, same seed) and compares the new metrics with the recorded ones.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from roboloop.availability import package_versions
from roboloop.receipts import DatasetRef, EvalSummary, ModelRef, OfflineSummary

REPO = Path(__file__).resolve().parents[1]


def git_commit(repo: Path = REPO) -> str:
    """HEAD's commit, suffixed `-dirty` when tracked files differ from it ('unknown' outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty else "")


# What shapes a stage's output besides its inputs and config: every cache key includes a hash of these.
CODE_DIRS = ("roboloop", "tasks", "flows")  # the library and the Prefect adapters over it
PINS = REPO / "constraints"  # the pinned package set
_file_digests: dict[str, tuple[tuple[int, int], bytes]] = {}


def _digest(p: Path) -> bytes:
    """sha256 of a file, recomputed only when its size or mtime changed (keys are computed often)."""
    st = p.stat()
    sig = (st.st_size, st.st_mtime_ns)
    hit = _file_digests.get(str(p))
    if hit is None or hit[0] != sig:
        hit = (sig, hashlib.sha256(p.read_bytes()).digest())
        _file_digests[str(p)] = hit
    return hit[1]


def _assets(h: Any) -> None:
    """The simulator assets in use: the shipped `assets/` by content; another $ISAACSIM_ASSET_ROOT (a mirror of
    NVIDIA's server can be large) by each file's path, size and mtime."""
    from roboloop.sim.assets import REPO_ASSETS, asset_root

    root = asset_root()
    if not root.is_dir():
        h.update(f"assets:{root}:missing".encode())
        return
    shipped = root.resolve() == REPO_ASSETS.resolve()
    for p in sorted(x for x in root.rglob("*") if x.is_file()):
        h.update(str(p.relative_to(root)).encode())
        st = p.stat()
        h.update(_digest(p) if shipped else f"{st.st_size}:{st.st_mtime_ns}".encode())


def code_version() -> str:
    """Hash of everything that shapes an output besides its inputs and config: the code (`roboloop/`, `tasks/`,
    `flows/`), the simulator assets (the task's USD), the pinned package set (`constraints/`) and the installed
    versions of the packages that compute (torch, lerobot, isaaclab, ...). A cache key part that changes
    exactly when one of them does."""
    h = hashlib.sha256()
    files = [p for d in CODE_DIRS for p in (REPO / d).rglob("*.py")]
    files += [p for p in PINS.rglob("*") if p.is_file()] if PINS.is_dir() else []
    for p in sorted(f for f in files if "__pycache__" not in f.parts):
        h.update(str(p.relative_to(REPO)).encode())
        h.update(_digest(p))
    _assets(h)
    h.update(json.dumps(package_versions(), sort_keys=True).encode())
    return h.hexdigest()[:16]


def config_hash(obj: Any) -> str:
    data = obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Lineage(BaseModel):
    """What the registry stores with a model version (`lineage.json`): the receipts of every stage that led
    to it, and (flat, for quick reading and for versions registered before receipts) their key facts."""

    git_commit: str = Field(default_factory=git_commit)
    code_version: str = Field(default_factory=code_version)
    raw: DatasetRef | None = Field(None, description="the dataset as ingested")
    dataset: DatasetRef | None = Field(None, description="the dataset trained on (v3)")
    model: ModelRef | None = Field(None, description="the trained model")
    evaluation: EvalSummary | None = Field(None, description="the evaluation the promotion gate used")
    baseline: EvalSummary | None = Field(None, description="a random policy on the same episodes")
    parents: list[str] = Field(default_factory=list, description="registry versions this one was derived from")
    dataset_md5: str = Field(description="DVC md5 of the training dataset (v3)")
    raw_dataset_md5: str | None = Field(None, description="DVC md5 of the raw dataset it was converted from")
    model_md5: str | None = Field(None, description="DVC md5 of the model folder")
    family: str = Field("vla", description="the model's policy family (roboloop.policies)")
    config: dict[str, Any] = Field(description="train config (and the convert/eval configs)")
    seed: int = 0
    metrics: dict[str, Any] = Field(description="training metrics (first/final loss, steps, ...)")
    eval: dict[str, Any] | None = Field(None, description="evaluation report (successes, episodes, CI, ...)")
    baseline_eval: dict[str, Any] | None = Field(None, description="the random policy's report on the same "
                                                 "episodes (what a first version must beat)")
    offline: OfflineSummary | None = Field(None, description="offline evaluation on held-out episodes (no simulator)")
    offline_eval: dict[str, Any] | None = Field(None, description="its key facts for the gate: dataset_md5, episodes, "
                                                "stride, seed, mse_norm, per_episode")
    packages: dict[str, str] = Field(default_factory=package_versions)
    created: float = Field(default_factory=time.time)
    flow_run: str | None = None

    @classmethod
    def of(cls, raw: DatasetRef | None, dataset: DatasetRef, model: ModelRef, evaluation: EvalSummary | None,
           configs: dict[str, Any], baseline: EvalSummary | None = None, offline: OfflineSummary | None = None,
           **kw: Any) -> Lineage:
        """A lineage from the stages' receipts (the flat fields derived from them)."""
        ev = eval_record(evaluation) if evaluation is not None else None
        checks = {k: (configs.get("eval") or {}).get(k) for k in ("gate_robustness", "gate_latency", "gate_envelope")}
        if ev is not None and any(v not in (None, False) for v in checks.values()):
            ev["gate"] = checks  # what the promotion gate checks besides the nominal episodes
        if baseline is not None:
            kw.setdefault("baseline_eval", {**eval_record(baseline), "policy": baseline.policy})
        return cls(raw=raw, dataset=dataset, model=model, evaluation=evaluation, baseline=baseline, offline=offline,
                   offline_eval=offline.gate_record() if offline is not None else None,
                   dataset_md5=dataset.md5, raw_dataset_md5=raw.md5 if raw else None, model_md5=model.md5,
                   family=model.family,
                   config={**configs, "train": model.config}, seed=int(model.config.get("seed", 0)),
                   metrics={**model.metrics, "weights_sha256": model.weights_sha256}, eval=ev, **kw)


def eval_record(evaluation: EvalSummary) -> dict[str, Any]:
    """An evaluation's key facts for the gate (flat, in lineage.json)."""
    ev = {k: getattr(evaluation, k) for k in ("task", "episodes", "successes", "success_rate", "ci_low", "ci_high",
                                              "seed")}
    ev["execute_steps"] = evaluation.execution.execute_steps
    if evaluation.outcomes is not None:
        ev["outcomes"] = evaluation.outcomes
    if evaluation.looks:  # sequential: the gate's test spends alpha / looks, as each look did
        ev["looks"] = evaluation.looks
    if evaluation.initial_states:  # which initial states those outcomes are of (the gate pairs agreeing ones)
        ev["initial_states"] = evaluation.initial_states
    # per factor and level, and per latency: the success and the outcomes on the same episodes, and the looks of a
    # run that could stop early (the gate's test of it spends alpha / looks)
    if evaluation.perturbations:
        ev["perturbations"] = {f: {lv: {k: c[k] for k in ("success_rate", "outcomes", "looks") if k in c}
                                   for lv, c in levels.items()} for f, levels in evaluation.perturbations.items()}
    if evaluation.envelope:  # what a robot's envelope would have refused (the gate may compare it)
        ev["envelope"] = {k: evaluation.envelope.get(k) for k in ("refused", "clamped", "steps")}
    if evaluation.latency:
        ev["latency"] = [{k: r[k] for k in ("setting", "ms", "delay_steps", "success_rate", "outcomes", "looks")
                          if k in r} for r in evaluation.latency]
    return ev
