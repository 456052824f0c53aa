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
from roboloop.procs import run_streaming
from roboloop.training import outdir
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
    plan = outdir.plan(cfg, fingerprint, overwrite=overwrite)
    if plan.moved_aside:
        on_line(f"moved the previous run aside to {plan.moved_aside}")
    if plan.action == "finished":
        on_line(f"{out} already holds this run's finished model ({plan.step} steps); nothing to train")
        return out
    outdir.claim(out, cfg, fingerprint)
    cfg_file = out / "train_config.json"
    fsutil.atomic_write_text(cfg_file, cfg.model_dump_json(indent=2))
    endpoint = launch.rdzv_endpoint
    if endpoint is None:
        if launch.nnodes > 1:
            raise ValueError("multi-node training needs rdzv_endpoint (host:port reachable from every node)")
        endpoint = f"127.0.0.1:{_free_port()}"
    rank_env: dict[str, str] = {}
    if launch.nnodes == 1 and launch.nproc_per_node == 1 and not launch.max_restarts:
        # one rank and no restarts: the rank alone, in its own process group as under torchrun, without the
        # launcher's agent and rendezvous (~4 s of each start here), with the rank variables torchrun would set
        # (so it trains as a rank: this launcher has planned and locked the folder)
        cmd = [sys.executable, "-m", "roboloop.entry", "train", str(cfg_file)]
        rank_env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0"}
    else:
        cmd = torchrun_command(str(cfg_file), launch.nproc_per_node, launch.nnodes, launch.node_rank,
                               endpoint, launch.max_restarts, launch.run_id)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}), **rank_env}
    if launch.nproc_per_node > 1 and "OMP_NUM_THREADS" not in child_env:
        child_env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // launch.nproc_per_node))
    code, tail = run_streaming(cmd, on_line, launch.timeout_s, child_env, what="training (torchrun and its ranks)")
    if code != 0:
        cause = next((line.strip() for line in reversed(tail) if _looks_like_error(line)), "see the log above")
        raise TrainingFailed(f"training exited with code {code}: {cause} (output in {out})")
    return out


def _looks_like_error(line: str) -> bool:
    """The exception line of a Python traceback ("roboloop.errors.CorruptFileError: ...")."""
    head = line.strip().split(":", 1)[0]
    return ":" in line and (head.endswith(("Error", "Exception")) or head.endswith("Failed")) and " " not in head


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `roboloop train --nproc-per-node N`")
