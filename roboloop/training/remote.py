"""Training on nodes that a scheduler starts elsewhere: the `closed-loop-cluster` deployment's flow runs on the cpu
pool and its train stage hands the training to the gpu pool, one flow run per node (`launch.deployment`, the
`train-node` deployment; process workers, one per GPU node). This process, the orchestrator, trains nothing: it
puts the dataset and the job's config into the run store, the nodes train (node 0 `launch.lead`, the others
`launch.join`) and mirror the run there, and it takes the finished model from the mirror.

    prepare(...)   the dataset published once per content, the job's config with the mirror it trains into
    take_model()   the finished model, verified, from the mirror into this machine's output folder

Who starts the nodes (a Prefect pool, here) is the caller's: roboloop imports no scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from roboloop import fsutil
from roboloop.training import outdir, runstore
from roboloop.training.config import LaunchConfig, TrainConfig, TrainRecipe


def prepare(dataset: Path, recipe: TrainRecipe, launch: LaunchConfig, out: Path, run_id: str) -> runstore.JoinDoc:
    """The job node 0 leads: `dataset` published in the run store, `recipe` as a TrainConfig mirrored under a folder
    named as `out` (the same mirror a rerun of the same training finds, so a lost job resumes from its checkpoints)."""
    store = runstore.store_url(required_for=f"training on the nodes of {launch.deployment or 'a pool'}")
    assert store is not None
    fingerprint = outdir.dataset_fingerprint(dataset)
    cfg = TrainConfig.of(recipe, str(dataset), str(out))
    cfg = cfg.model_copy(update={"mirror": runstore.mirror_url(store, out, cfg, fingerprint)})
    url = runstore.publish_dataset(store, dataset, fingerprint)
    return runstore.JoinDoc(run_id=run_id, config=cfg.model_dump(mode="json"), dataset_url=url,
                            fingerprint=fingerprint, nnodes=launch.nnodes, nproc_per_node=launch.nproc_per_node,
                            max_restarts=launch.max_restarts)


def take_model(job: runstore.JoinDoc, out: Path) -> bool:
    """The job's finished model from its mirror into `out`; False when the mirror holds none (yet). A folder of
    roboloop's already at `out` (an earlier take whose receipt was lost) is moved aside, never deleted; anything
    else there is refused."""
    mirror = runstore.Mirror(job.config["mirror"])
    if not mirror.keys(runstore.MODEL_LAST):
        return False
    if out.exists() and any(out.iterdir()):
        if not fsutil.is_ours(out):
            raise FileExistsError(f"{out} holds files roboloop did not write: the model of run {job.run_id!r} is not "
                                  "put there")
        outdir.move_aside(out)
    return mirror.pull_model(out)


class NodeParams(BaseModel):
    """One node's part of a job (the `train-node` flow's parameters): node 0 gets the job; the others find it, and
    node 0's rendezvous, in the run store."""

    run_id: str = Field(description="the job, as the run store names it (jobs/<run id>/)")
    node_rank: int = Field(0, ge=0, description="this node's index")
    nnodes: int = Field(1, ge=1, description="nodes in the job")
    nproc_per_node: int = Field(1, ge=1, description="ranks on each node")
    collective_timeout_s: float = Field(600, gt=0, description="how long ranks wait for a lost node")
    job: runstore.JoinDoc | None = Field(None, description="node 0: the config and dataset it trains on")


def node_params(job: runstore.JoinDoc, launch: LaunchConfig) -> list[NodeParams]:
    """What each of the job's nodes is started with."""
    return [NodeParams(run_id=job.run_id, node_rank=k, nnodes=job.nnodes, nproc_per_node=job.nproc_per_node,
                       collective_timeout_s=launch.collective_timeout_s, job=job if k == 0 else None)
            for k in range(job.nnodes)]


def run_node(p: NodeParams, on_line: Callable[[str], None] = print) -> Path:
    """This machine's part of the job: node 0 leads it, the others join; returns this node's run folder."""
    from roboloop.settings import settings
    from roboloop.training import launch as launcher

    st = settings()
    launch = LaunchConfig(nnodes=p.nnodes, nproc_per_node=p.nproc_per_node, node_rank=p.node_rank, run_id=p.run_id,
                          collective_timeout_s=p.collective_timeout_s)
    out_root = Path(st.artifacts).absolute() / "models"
    if p.node_rank == 0:
        if p.job is None:
            raise ValueError(f"node 0 of run {p.run_id!r} was started without its job")
        return launcher.lead(p.job, launch, out_root, st.cache_dir, on_line)
    return launcher.join(launch, out_root, st.cache_dir, st.join_timeout_s, on_line)
