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

from pydantic import BaseModel, Field

from roboloop.procs import run_streaming
from roboloop.training.config import TrainConfig
from roboloop.training.distributed import torchrun_command


def _env_int(name: str, default: int) -> int:
    """Cluster job templates (infra/k8s-gpu-pool.json) describe the job through the environment."""
    return int(os.environ.get(name, default))


class LaunchConfig(BaseModel):
    """How many processes, on how many nodes (torchrun's c10d rendezvous)."""

    nproc_per_node: int = Field(default_factory=lambda: _env_int("ROBOLOOP_NPROC_PER_NODE", 1), ge=1,
                                description="ranks on this node (GPUs, or CPU processes)")
    nnodes: int = Field(default_factory=lambda: _env_int("ROBOLOOP_NNODES", 1), ge=1, description="nodes in the job")
    node_rank: int = Field(0, ge=0, description="this node's index (the flow's node is 0)")
    rdzv_endpoint: str | None = Field(
        default_factory=lambda: os.environ.get("ROBOLOOP_RDZV_ENDPOINT"),
        description="host:port of the rendezvous on node 0 (multi-node: required; one node: a free local port)")
    max_restarts: int = Field(0, ge=0, description="torchrun restarts of failed ranks (they auto-resume)")
    run_id: str = Field("roboloop", description="rendezvous id shared by all nodes of one job")
    timeout_s: float | None = Field(None, gt=0, description="kill the job after this many seconds")


class TrainingFailed(RuntimeError):
    pass


def run_torchrun(cfg: TrainConfig, launch: LaunchConfig, on_line: Callable[[str], None] = print,
                 env: dict[str, str] | None = None) -> Path:
    """Train `cfg` with torchrun on this node; returns the output folder. Raises on failure."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg_file = out / "train_config.json"
    tmp = cfg_file.with_suffix(".tmp")
    tmp.write_text(cfg.model_dump_json(indent=2))
    tmp.replace(cfg_file)
    endpoint = launch.rdzv_endpoint
    if endpoint is None:
        if launch.nnodes > 1:
            raise ValueError("multi-node training needs rdzv_endpoint (host:port reachable from every node)")
        endpoint = f"127.0.0.1:{_free_port()}"
    cmd = torchrun_command(str(cfg_file), launch.nproc_per_node, launch.nnodes, launch.node_rank,
                           endpoint, launch.max_restarts, launch.run_id)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if launch.nproc_per_node > 1 and "OMP_NUM_THREADS" not in child_env:
        child_env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // launch.nproc_per_node))
    code, _ = run_streaming(cmd, on_line, launch.timeout_s, child_env, what="training (torchrun and its ranks)")
    if code != 0:
        raise TrainingFailed(f"torchrun exited with code {code}; see the log above (output in {out})")
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `roboloop train --nproc-per-node N`")
