"""Atomic checkpoints: write `step-N.tmp-PID/`, fsync, rename to `step-N/`, keep the last k.

A checkpoint holds model, optimizer, scheduler, RNG states and the data stream position, so
a run killed at any instant restarts from the newest complete checkpoint and continues with
exactly the batches an uninterrupted run would have seen. A heartbeat file next to them says
the run is alive and at which step.

`meta.json` (written last) lists every file's sha256: a checkpoint whose bytes changed since
(a flipped bit, a copy cut short) is never resumed; `latest` falls back to the newest intact one
and says why it skipped the others.

A checkpoint is data, never code: what it holds is tensors and plain types (numpy's RNG state and
arrays are stored as tensors), and it is read with `torch.load(weights_only=True)`, which builds
nothing else. The checksums prove only that the bytes are those the writer wrote, and anyone who
can write the run store (an S3 prefix every training node reads) can write `meta.json` too: a file
that asks for any other object (a planted pickle, or a checkpoint from before this format) is
refused as untrusted, by name, and nothing in it runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

PREFIX = "step-"
log = logging.getLogger(__name__)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _checksums(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): _sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "meta.json"}


def damage(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be trusted (a file missing, changed or extra), or None when every
    file matches the checksums its meta.json recorded (checkpoints written before checksums: None)."""
    try:
        recorded = json.loads((path / "meta.json").read_text()).get("files")
    except (OSError, ValueError) as e:
        return f"{path / 'meta.json'} cannot be read ({e})"
    if recorded is None:
        return None
    now = _checksums(path)
    for rel, digest in recorded.items():
        if rel not in now:
            return f"{path / rel} is missing"
        if now[rel] != digest:
            return f"{path / rel} does not match its recorded sha256 (changed or cut short since it was written)"
    extra = sorted(set(now) - set(recorded))
    return f"{path / extra[0]} was not part of the checkpoint" if extra else None


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = [str(kind), torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos), int(has_gauss),
                   float(cached)]
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def plain(obj: Any) -> Any:
    """`obj` as what `torch.load(weights_only=True)` reads back: numpy arrays as tensors, numpy scalars as Python
    numbers, containers of those; anything else is refused here, at save time, rather than written unreadable."""
    if obj is None or isinstance(obj, (torch.Tensor, bool, int, float, str, bytes, torch.dtype, torch.device,
                                       torch.Size)):
        return obj
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if type(obj) is tuple:
        return tuple(plain(v) for v in obj)
    if isinstance(obj, (list, tuple)):  # a list, or a named tuple's values
        return [plain(v) for v in obj]
    raise TypeError(f"a checkpoint holds tensors and plain types; got a {type(obj).__name__}")


def save(ckpt_dir: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"{PREFIX}{step:08d}"
    tmp = ckpt_dir / f"{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with open(tmp / "state.pt", "wb") as f:
            torch.save(plain(state), f)
            f.flush()
            os.fsync(f.fileno())
        _publish(tmp, final, {"step": step, "time": time.time()}, keep_last)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        _raise_disk_full(e, final)
        raise
    return final


def _raise_disk_full(e: BaseException, final: Path) -> None:
    """torch.save reports a full disk as "unexpected pos ..." (its zip writer), hiding the ENOSPC underneath."""
    from roboloop.errors import DiskFullError

    text = f"{e} {e.__cause__ or ''} {e.__context__ or ''}"
    if getattr(e, "errno", None) == 28 or "No space left" in text or "unexpected pos" in text:
        raise DiskFullError(f"no space left on the device while writing checkpoint {final}; the previous "
                            "checkpoints are kept: free space and rerun to resume") from e


_PINNED: set[Path] = set()  # checkpoints this process still reads (a push to the run store in flight or queued)


def pin(path: Path) -> None:
    """Keep `path` from pruning until `unpin` (it may then outlive keep_last until the next save prunes)."""
    _PINNED.add(path.absolute())


def unpin(path: Path) -> None:
    _PINNED.discard(path.absolute())


def _publish(tmp: Path, final: Path, meta: dict[str, Any], keep_last: int) -> None:
    """meta.json last (it marks the folder complete, with every file's sha256), then rename into place and
    prune old ones (not a pinned one: its push is under way)."""
    (tmp / "meta.json").write_text(json.dumps({**meta, "files": _checksums(tmp)}))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    _fsync_dir(final.parent)
    prune(final.parent, keep_last)


def prune(ckpt_dir: Path, keep_last: int) -> None:
    """Remove the whole checkpoints beyond the newest `keep_last`, but not a pinned one (a push is reading it)."""
    for old in complete(ckpt_dir)[:-keep_last]:
        if old.absolute() not in _PINNED:
            shutil.rmtree(old, ignore_errors=True)


def complete(ckpt_dir: Path) -> list[Path]:
    """Finished checkpoints, oldest first (temporary folders of killed writes are ignored)."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if p.name.startswith(PREFIX) and ".tmp-" not in p.name
                  and (p / "meta.json").exists())


def latest(ckpt_dir: Path) -> Path | None:
    """The newest intact checkpoint. Damaged ones are skipped with a warning naming the file; when every
    checkpoint is damaged, CorruptFileError names the newest (resuming from nothing would silently restart)."""
    from roboloop.errors import CorruptFileError

    found = complete(ckpt_dir)
    problems: list[str] = []
    for path in reversed(found):
        why = damage(path)
        if why is None:
            for p in problems:
                log.warning("skipping a damaged checkpoint: %s; resuming from %s", p, path.name)
            return path
        problems.append(why)
    if problems:
        raise CorruptFileError(f"every checkpoint in {ckpt_dir} is damaged ({problems[0]}); move the folder aside "
                               "or train with resume=False to start over")
    return None


def read_data(file: Path) -> Any:
    """A checkpoint file's tensors and plain values, read so that nothing in it can run (`weights_only=True`);
    UntrustedFileError when it asks for anything else, CorruptFileError when it cannot be read at all."""
    import pickle
    import warnings

    from roboloop.errors import CorruptFileError, UntrustedFileError

    try:
        with warnings.catch_warnings():  # a bare pickle's protocol is warned about before it is refused below
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise UntrustedFileError(f"{file} asks to build {_globals(file)} when loaded: a checkpoint holds tensors and "
                                 "plain values only, so it was planted or written before roboloop stored checkpoints "
                                 "as data; refused as untrusted, nothing in it was run (resume from another "
                                 "checkpoint, or train with resume=False)") from e
    except (RuntimeError, EOFError, OSError, ValueError) as e:  # torch's zip reader names no file
        raise CorruptFileError(f"{file} cannot be read ({str(e).splitlines()[0]})") from e


def _globals(file: Path) -> str:
    """The objects a pickle would look up (read from its opcodes, never run)."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(str(file))
    except Exception:  # noqa: BLE001 - not a torch zip file at all: a bare pickle
        names = _pickle_globals(file)
    return ", ".join(sorted(names)[:4]) + (" ..." if len(names) > 4 else "") if names else "objects"


def _pickle_globals(file: Path) -> list[str]:
    """The globals a bare pickle names, from its opcodes (pickletools reads, never runs)."""
    import pickletools

    names: set[str] = set()
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(file.read_bytes()):
            if op.name == "GLOBAL":
                names.add(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.add(f"{strings[-2]}.{strings[-1]}")
            elif isinstance(arg, str):
                strings.append(arg)
    except Exception:  # noqa: BLE001 - cut short or not a pickle: name what was seen
        pass
    return sorted(names)


def load(path: Path) -> dict[str, Any]:
    return read_data(path / "state.pt")


def heartbeat(path: Path, step: int, **extra: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "time": time.time(), "pid": os.getpid(), **extra}))
    tmp.replace(path)


def save_sharded(ckpt_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 extra: dict[str, Any], keep_last: int, rank: int, barrier: Any, local_rank: int = 0,
                 gather: Any = None) -> Path:
    """FSDP checkpoint: every rank writes its shards with torch.distributed.checkpoint (DCP).

    Same atomicity as `save`: shards and rank 0's `extra.pt` (step, scheduler, RNG, data position) go to
    `step-N.tmp-dcp/`; only after every rank has finished is meta.json written and the folder renamed. The shards
    reload on any world size (DCP reshards).

    `gather` (nodes that share no folder, their checkpoints meeting in the run store): each node's folder holds its
    own ranks' shards; every node's first rank writes and publishes it, with the checksums of its own files
    (`files`, so the folder is intact where it is) and of every node's (`whole`, gathered: what the checkpoint is,
    which the run store's copy says and `whole(path)` checks). Without it the nodes share `ckpt_dir` and rank 0
    publishes.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = ckpt_dir / f"{PREFIX}{step:08d}"
    tmp = ckpt_dir / f"{final.name}.tmp-dcp"
    writer = (local_rank if gather is not None else rank) == 0  # who prepares and publishes this folder
    if writer:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    barrier()
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=str(tmp))
    if rank == 0:
        torch.save(plain(extra), tmp / "extra.pt")
    barrier()
    meta: dict[str, Any] = {"step": step, "time": time.time(), "format": "dcp"}
    if gather is not None:
        mine = _checksums(tmp) if writer else {}
        meta["whole"] = {k: v for node in gather(mine) for k, v in node.items()}
    if writer:
        _publish(tmp, final, meta, keep_last)
    barrier()
    return final


def whole(path: Path) -> bool:
    """The checkpoint at `path` is intact and complete here: every file it consists of is in this folder (a node's
    own part of a checkpoint its nodes wrote apart is intact, not whole)."""
    if damage(path) is not None:
        return False
    meta = json.loads((path / "meta.json").read_text())
    return set(meta.get("whole") or ()) <= set(meta.get("files") or meta.get("whole") or ())


def is_sharded(path: Path) -> bool:
    return (path / "extra.pt").exists()


def load_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Load a DCP checkpoint into an FSDP model and optimizer (collective); returns the extra state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optimizer": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return read_data(path / "extra.pt")
