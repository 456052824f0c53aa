"""Which checkpoint every rank resumes from: rank 0's choice, held by every node.

On one node the ranks share the output folder. Across nodes each node has a folder of its own, and only node 0's
has the checkpoints (rank 0 writes them; an FSDP checkpoint's shards are written by every node, each node's into
its own folder); with a mirror (`runstore`) they are in S3 as well, whole. Rank 0 picks the newest
intact checkpoint it can reach (its folder or the mirror) and tells the others; each node's first rank downloads
it when its folder lacks it; then all ranks check that every node has it, and load it, or all fail together naming
the node that has not (a rank alone failing would leave the others waiting in a collective).
"""

from __future__ import annotations

import socket
from pathlib import Path

import torch

from roboloop.errors import CorruptFileError, RoboloopError
from roboloop.training import checkpoint, distributed
from roboloop.training.runstore import Mirror


class ResumeError(RoboloopError):
    pass


def _step(path: Path | None) -> int:
    return int(path.name[len(checkpoint.PREFIX):]) if path is not None else 0


def _choose(ckpt_dir: Path, mirror: Mirror | None, keep_last: int) -> int:
    """Rank 0: the newest intact checkpoint in its folder or the mirror (its own pushed there first when newer)."""
    mine = checkpoint.latest(ckpt_dir)
    if mine is not None and not checkpoint.whole(mine):  # node 0's part of one its nodes wrote apart: the store's
        mine = None
    local = _step(mine)
    remote = max(mirror.checkpoint_steps(), default=0) if mirror else 0
    if mirror and mine is not None and local > remote:
        mirror.push_checkpoint(mine, keep_last)
    return max(local, remote)


def agreed_checkpoint(ckpt_dir: Path, env: distributed.DistEnv, mirror_url: str | None,
                      keep_last: int = 2) -> Path | None:
    """The checkpoint every rank loads (None: start from step 0); raises on every rank alike when it cannot be.

    Rank 0's newest may not be in the mirror yet (the rank that was pushing it died): it is pushed first, so every
    node can fetch what rank 0 chose."""
    if env.world_size == 1 and not mirror_url:
        return checkpoint.latest(ckpt_dir)
    mirror = Mirror(mirror_url) if mirror_url else None
    choice, why = 0, ""
    if env.is_main:
        try:
            choice = _choose(ckpt_dir, mirror, keep_last)
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, not wait for rank 0 in a collective
            choice, why = -1, str(e)
    choice = int(distributed.all_reduce_sum(torch.tensor(choice, dtype=torch.int64, device=env.device), env).item())
    if choice < 0:
        raise ResumeError(f"rank 0 could not choose a checkpoint to resume from: {why or 'see rank 0'}")
    if choice == 0:
        return None
    path = ckpt_dir / f"{checkpoint.PREFIX}{choice:08d}"
    ok, why = 1, ""
    if env.local_rank == 0 and (not path.is_dir() or not checkpoint.whole(path)):
        try:
            if mirror is None:
                raise ResumeError(f"no intact {path.name} in {ckpt_dir} on {socket.gethostname()}: nodes that share "
                                  "no folder resume through a run store (ROBOLOOP_RUN_STORE)")
            mirror.pull_checkpoint(choice, ckpt_dir)
        except (RoboloopError, CorruptFileError, OSError) as e:
            ok, why = 0, str(e)
    everyone = int(distributed.all_reduce_sum(torch.tensor(ok, dtype=torch.int64, device=env.device), env).item())
    if everyone < env.world_size:
        raise ResumeError(why or f"{env.world_size - everyone} rank(s) on other nodes could not get checkpoint "
                          f"{path.name} (their logs say why)")
    return path
