"""`train.compile`: torch.compile of the training step, per block (regional compilation, as torchtitan does): each of
the model's repeated blocks is compiled once, with dynamic shapes, so a packed batch of another token count or
longest sample reuses the compiled code instead of compiling again. Everything between the blocks (embeddings,
packing, the loss) stays eager.

    plan(requested, family, device_type) -> (compile?, why)     auto: where bench/compile.py measured it faster
    apply(model) -> the regions compiled                        in place, before DDP/FSDP wrap the model
    counts() -> graphs compiled, graph breaks, recompiles       for the run record and the progress rows
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

log = logging.getLogger(__name__)

# compiled / eager training samples per second, measured by bench/compile.py (its JSON line: speedup_vla,
# speedup_act) on the machine named; `auto` compiles a family on a device type where this is at least AUTO_MIN
MEASURED: dict[tuple[str, str], tuple[float, str]] = {
    ("vla", "cpu"): (1.074, "2026-12-05, 2-core Intel Xeon, the demo's recipe; GEMMs and attention kernels are 45% "
                            "of its step and compile only fuses the rest"),
}
AUTO_MIN = 1.1
FAMILIES = ("vla",)  # families whose blocks roboloop compiles (regions: `blocks`, `head_blocks`)


def plan(requested: str, family: str, device_type: str) -> tuple[bool, str]:
    """Whether to compile, and why; an explicit `on` that cannot be honoured is refused with the reason."""
    if requested == "off":
        return False, "off: eager"
    if family not in FAMILIES:
        if requested == "on":
            raise ValueError(f"compile=on: roboloop compiles only the blocks of family {', '.join(FAMILIES)}; "
                             f"family {family!r} trains eager (compile=off or auto)")
        return False, f"auto: family {family} has no compiled regions yet"
    if requested == "on":
        return True, "on: requested"
    found = MEASURED.get((family, device_type))
    if found is None:
        return False, (f"auto: no bench/compile.py measurement for {family} on {device_type} yet; eager "
                       "(compile=on to try it)")
    speedup, where = found
    if speedup >= AUTO_MIN:
        return True, f"auto: bench/compile.py measured {speedup:.2f}x eager for {family} on {device_type} ({where})"
    return False, (f"auto: bench/compile.py measured {speedup:.2f}x eager for {family} on {device_type} ({where}), "
                   f"under {AUTO_MIN}x: eager")


def regions(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: what is compiled, one region each."""
    return [*getattr(model, "blocks", []), *getattr(model, "head_blocks", [])]


def apply(model: nn.Module) -> int:
    """Compile each region in place (its parameters and state_dict keys unchanged: checkpoints are the same files);
    returns how many. Before DDP/FSDP wrap the model."""
    found = regions(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no blocks to compile")
    for block in found:
        block.compile(dynamic=True)
    return len(found)


def counts() -> dict[str, Any]:
    """Graphs compiled so far in this process, graph breaks (with their reasons), recompiles: graphs beyond one per
    distinct block type."""
    from torch._dynamo.utils import counters

    breaks = dict(counters.get("graph_break", {}))
    graphs = int(counters["stats"]["unique_graphs"])
    return {"graphs": graphs, "graph_breaks": sum(breaks.values()), "graph_break_reasons": list(breaks)[:5]}


def record(requested: str, on: bool, why: str, regions_compiled: int, block_types: int) -> dict[str, Any]:
    """The run record's `compile` entry; its counts are updated as the run goes (`update`)."""
    return {"requested": requested, "compiled": on, "why": why, "regions": regions_compiled,
            "block_types": block_types, "graphs": 0, "recompiles": 0, "graph_breaks": 0}


def update(rec: dict[str, Any]) -> dict[str, Any]:
    if rec.get("compiled"):
        c = counts()
        rec.update(graphs=c["graphs"], recompiles=max(0, c["graphs"] - rec["block_types"]),
                   graph_breaks=c["graph_breaks"], graph_break_reasons=c["graph_break_reasons"])
    return rec
