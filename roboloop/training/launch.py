"""Run training under torchrun as a child process group: stream its output, kill it whole.

`run_torchrun` is what `roboloop train --nproc-per-node N` and the Prefect train task use.
torchrun runs under `roboloop.procs.run_streaming`: its own process group, output streamed
line by line, the whole group killed on error, cancellation or timeout.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from roboloop import fsutil
from roboloop.errors import RoboloopError
from roboloop.procs import passive_waits, run_streaming
from roboloop.training import outdir, runstore
from roboloop.training.config import LaunchConfig, TrainConfig
from roboloop.training.distributed import torchrun_command


class TrainingFailed(RoboloopError):
    pass


def run_torchrun(cfg: TrainConfig, launch: LaunchConfig, on_line: Callable[[str], None] = print,
                 env: dict[str, str] | None = None, overwrite: bool = False) -> Path:
    """Train `cfg` with torchrun on this node; returns the output folder. Raises on failure.

    The output folder is planned and claimed here, once (see `outdir`): a finished run of the same
    config returns at once, another run's folder is refused before any rank starts, and a run still writing
    it (another process, this node) is refused with its pid: two runs never write one folder."""
    out = Path(cfg.output_dir).absolute()
    if launch.node_rank != 0:  # node 0's launcher holds the lock; the others join its run
        return _run_torchrun(cfg, launch, on_line, env, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    with fsutil.exclusive(fsutil.lock_path_for(out), f"training folder {out}"):
        return _run_torchrun(cfg, launch, on_line, env, overwrite)


def _run_torchrun(cfg: TrainConfig, launch: LaunchConfig, on_line: Callable[[str], None],
                  env: dict[str, str] | None, overwrite: bool) -> Path:
    out = Path(cfg.output_dir)
    outdir.check_init_from(cfg.init_from)
    fingerprint = outdir.dataset_fingerprint(cfg.dataset)
    cfg = _with_mirror(cfg, launch, fingerprint, on_line)
    plan = outdir.plan(cfg, fingerprint, overwrite=overwrite)
    if plan.moved_aside:
        on_line(f"moved the previous run aside to {plan.moved_aside}")
    if plan.action == "finished":
        on_line(f"{out} already holds this run's finished model ({plan.step} steps); nothing to train")
        if cfg.mirror and launch.node_rank == 0:  # a retried node 0 whose model never reached the store delivers it
            _deliver(cfg, launch, fingerprint, out, on_line, finished=True)
        return out
    outdir.claim(out, cfg, fingerprint)
    cfg_file = out / "train_config.json"
    fsutil.atomic_write_text(cfg_file, cfg.model_dump_json(indent=2))
    if launch.nnodes > 1 and launch.node_rank == 0 and cfg.mirror:
        _invite(cfg, launch, fingerprint, on_line)
    code, tail = run_streaming(_command(cfg_file, launch), on_line, launch.timeout_s,
                               _child_env(launch, env), what="training (torchrun and its ranks)")
    if code != 0:
        raise _failure(code, tail, cfg, launch)
    if cfg.mirror and launch.node_rank == 0:
        _deliver(cfg, launch, fingerprint, out, on_line)
    return out


def _deliver(cfg: TrainConfig, launch: LaunchConfig, fingerprint: str, out: Path, on_line: Callable[[str], None],
             finished: bool = False) -> None:
    """Node 0: the finished model into the run's mirror, retried while the store fails (for up to
    ROBOLOOP_STORE_GRACE_S), or raised: a model that never reached the store is never reported delivered. A run found
    finished also tells nodes that wait for it (a retried job) that there is nothing to train."""
    from roboloop.settings import settings

    assert cfg.mirror is not None
    pushed = runstore.Mirror(cfg.mirror).deliver_model(out, settings().store_grace_s, on_line)
    on_line(f"model mirrored to {cfg.mirror}" if pushed else f"the model is already in {cfg.mirror}")
    if finished and launch.nnodes > 1:
        store = runstore.store_url()
        assert store is not None
        runstore.publish_join(store, runstore.JoinDoc(
            run_id=launch.run_id, config=cfg.model_dump(mode="json"), dataset_url="", fingerprint=fingerprint,
            nnodes=launch.nnodes, nproc_per_node=launch.nproc_per_node, max_restarts=launch.max_restarts,
            finished=True))
        on_line(f"told nodes 1..{launch.nnodes - 1} of run {launch.run_id!r} that it is finished")


def _command(cfg_file: Path, launch: LaunchConfig) -> list[str]:
    endpoint = launch.rdzv_endpoint
    if endpoint is None:
        if launch.nnodes > 1:
            raise ValueError("multi-node training needs rdzv_endpoint (host:port reachable from every node)")
        endpoint = f"127.0.0.1:{_free_port()}"
    if launch.nnodes == 1 and launch.nproc_per_node == 1 and not launch.max_restarts:
        # one rank and no restarts: the rank alone, in its own process group as under torchrun, without the
        # launcher's agent and rendezvous (~4 s of each start here), with the rank variables torchrun would set
        # (so it trains as a rank: this launcher has planned and locked the folder)
        return [sys.executable, "-m", "roboloop.entry", "train", str(cfg_file)]
    return torchrun_command(str(cfg_file), launch.nproc_per_node, launch.nnodes, launch.node_rank, endpoint,
                            launch.max_restarts, launch.run_id, launch.collective_timeout_s)


def _child_env(launch: LaunchConfig, env: dict[str, str] | None) -> dict[str, str]:
    alone = launch.nnodes == 1 and launch.nproc_per_node == 1 and not launch.max_restarts
    rank_env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0"} \
        if alone else {}
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}), **rank_env,
                 "ROBOLOOP_COLLECTIVE_TIMEOUT_S": str(launch.collective_timeout_s)}
    if launch.max_restarts:
        # torchrun shares its rendezvous store with the ranks for every round: after a restart, a new rank can read
        # a dead rank's address left there by the round before (gloo: "Connection refused" on a stale port; found
        # by tests/cluster/test_lost_node.py across nodes, and by bench/restart.py on one). A store of each round's
        # own keeps the rounds apart.
        child_env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    passive_waits(child_env)  # beside another busy process, spinning ranks fell to 2% of their speed alone
    if launch.nproc_per_node > 1 and "OMP_NUM_THREADS" not in child_env:
        child_env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // launch.nproc_per_node))
    return child_env


def _failure(code: int, tail: list[str], cfg: TrainConfig, launch: LaunchConfig) -> TrainingFailed:
    """One line naming why training failed: a lost node (what torch's process groups and rendezvous say when a peer
    is gone), or the exception line of the traceback."""
    errors = [line.strip() for line in reversed(tail) if _looks_like_error(line)]
    # torchrun's own "ChildFailedError" comes last and says only that a rank failed: the rank's exception says why
    cause = next((e for e in errors if "ChildFailedError" not in e), errors[0] if errors else "see the log above")
    if launch.nnodes > 1 and any(sign in line for line in tail for sign in LOST_NODE):
        where = f" in {cfg.mirror}" if cfg.mirror else ""
        return TrainingFailed(f"training lost a node: ranks waited collective_timeout_s="
                              f"{launch.collective_timeout_s:g} s for it, then stopped ({cause}); rerun, or re-create "
                              f"the job, to resume from the latest checkpoint{where} (output in {cfg.output_dir})")
    return TrainingFailed(f"training exited with code {code}: {cause} (output in {cfg.output_dir})")


def _with_mirror(cfg: TrainConfig, launch: LaunchConfig, fingerprint: str,
                 on_line: Callable[[str], None]) -> TrainConfig:
    """Node 0 with a run store: the run's mirror there (checkpoints, the model); a finished model found there is
    taken into an empty output folder (a re-created job has nothing on its disk), so it is not trained again."""
    if launch.node_rank != 0 or cfg.mirror:
        return cfg
    store = runstore.store_url()
    if store is None:  # one node, or nodes that share a folder
        return cfg
    mirror = runstore.mirror_url(store, Path(cfg.output_dir), cfg, fingerprint)
    out = Path(cfg.output_dir)
    if (not out.exists() or not any(out.iterdir())) and runstore.Mirror(mirror).pull_model(out):
        on_line(f"took this run's finished model from {mirror}")
    return cfg.model_copy(update={"mirror": mirror})


def join(launch: LaunchConfig, out_root: Path, cache_dir: str | Path, timeout_s: float,
         on_line: Callable[[str], None] = print) -> Path:
    """A node other than 0 of a run whose nodes share no folder: wait for node 0's join document in the run store,
    download the dataset it names into this node's cache, and run this node's ranks into a folder of its own."""
    store = runstore.store_url(required_for="joining a multi-node run")
    assert store is not None
    on_line(f"node {launch.node_rank} waits for run {launch.run_id!r} at {store}/jobs/{launch.run_id}")
    doc = runstore.wait_join(store, launch.run_id, timeout_s)
    if doc.finished:
        on_line(f"node 0 says run {launch.run_id!r} is finished (its model is in {doc.config.get('mirror')}): "
                "nothing to train on this node")
        return out_root / Path(doc.config["output_dir"]).name
    if (doc.nnodes, doc.nproc_per_node) != (launch.nnodes, launch.nproc_per_node):
        raise ValueError(f"run {doc.run_id!r} is {doc.nnodes} node(s) x {doc.nproc_per_node} rank(s), but this node "
                         f"was started as one of {launch.nnodes} x {launch.nproc_per_node}: the job's settings differ "
                         "between its nodes")
    if launch.rdzv_endpoint is None and doc.rdzv_endpoint is None:
        raise ValueError(f"run {doc.run_id!r}: node 0 named no rendezvous and this node was given none "
                         "(ROBOLOOP_RDZV_ENDPOINT)")
    dataset = runstore.fetch_dataset(doc.dataset_url, doc.fingerprint, cache_dir)
    cfg = TrainConfig.model_validate({**doc.config, "dataset": str(dataset),
                                      "output_dir": str(out_root / Path(doc.config["output_dir"]).name)})
    on_line(f"node {launch.node_rank} joins: dataset {dataset}, output {cfg.output_dir}")
    launch = launch.model_copy(update={"max_restarts": doc.max_restarts,
                                       "rdzv_endpoint": launch.rdzv_endpoint or doc.rdzv_endpoint})
    return run_torchrun(cfg, launch, on_line)


def lead(job: runstore.JoinDoc, launch: LaunchConfig, out_root: Path, cache_dir: str | Path,
         on_line: Callable[[str], None] = print) -> Path:
    """Node 0 of a job that an orchestrator prepared in the run store (`roboloop.training.remote`): the dataset it
    published, downloaded here; the rendezvous on this host, which the other nodes read from the join document; the
    run mirrored where the orchestrator will take the model from."""
    import socket

    dataset = runstore.fetch_dataset(job.dataset_url, job.fingerprint, cache_dir)
    cfg = TrainConfig.model_validate({**job.config, "dataset": str(dataset),
                                      "output_dir": str(out_root / Path(job.config["output_dir"]).name)})
    if not cfg.mirror:
        raise ValueError(f"job {job.run_id!r} names no mirror: its model would stay on this node's disk")
    endpoint = launch.rdzv_endpoint or f"{socket.gethostname()}:{_free_port('0.0.0.0')}"
    on_line(f"node 0 of run {job.run_id!r} on {socket.gethostname()}: dataset {dataset}, output {cfg.output_dir}, "
            f"rendezvous {endpoint}")
    launch = launch.model_copy(update={"nnodes": job.nnodes, "nproc_per_node": job.nproc_per_node, "node_rank": 0,
                                       "max_restarts": job.max_restarts, "run_id": job.run_id,
                                       "rdzv_endpoint": endpoint})
    return run_torchrun(cfg, launch, on_line)


def _invite(cfg: TrainConfig, launch: LaunchConfig, fingerprint: str, on_line: Callable[[str], None]) -> None:
    """Node 0: the dataset and this run's config into the run store, where the other nodes wait for them."""
    store = runstore.store_url(required_for="multi-node training")
    assert store is not None
    url = runstore.publish_dataset(store, Path(cfg.dataset), fingerprint)
    runstore.publish_join(store, runstore.JoinDoc(
        run_id=launch.run_id, config=cfg.model_dump(mode="json"), dataset_url=url, fingerprint=fingerprint,
        nnodes=launch.nnodes, nproc_per_node=launch.nproc_per_node, max_restarts=launch.max_restarts,
        rdzv_endpoint=launch.rdzv_endpoint))
    on_line(f"nodes 1..{launch.nnodes - 1} of run {launch.run_id!r} join through {store}/jobs/{launch.run_id}")


# what torch's gloo / NCCL process groups and torchrun's rendezvous say when a peer is gone
LOST_NODE = ("Timed out waiting", "Connection closed by peer", "Connection reset by peer", "Watchdog caught collective",
             "RendezvousTimeoutError", "RendezvousClosedError", "DistNetworkError", "Socket Timeout")


def _looks_like_error(line: str) -> bool:
    """The exception line of a Python traceback ("roboloop.errors.CorruptFileError: ...")."""
    head = line.strip().split(":", 1)[0]
    return ":" in line and (head.endswith(("Error", "Exception")) or head.endswith("Failed")) and " " not in head


def _free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `roboloop train --nproc-per-node N`")
