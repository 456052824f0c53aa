"""`train.compile`: torch.compile of the training step, per block (regional compilation, as torchtitan does): each of
the model's repeated blocks is compiled once, with dynamic shapes, so a packed batch of another token count or
longest sample reuses the compiled code instead of compiling again. Everything between the blocks (embeddings,
packing, the loss) stays eager. The regions are the VLA's transformer blocks and, for LeRobot's policies, the layers
they keep in ModuleLists (ACT's encoder and decoder layers, Diffusion's U-Net blocks): `module.compile_regions()`.

    plan(requested, kind, device, has_regions) -> (compile?, why)   auto: where bench/compile.py measured faster
    apply(model) -> the regions compiled                            in place, before DDP/FSDP wrap the model
    counts() -> graphs compiled, graph breaks, recompiles           for the run record and the progress rows
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

log = logging.getLogger(__name__)

# compiled / eager training samples per second, measured by bench/compile.py (its JSON line: speedup_vla,
# speedup_act, speedup_diffusion) on the machine named; `auto` compiles a model kind (the trainable's `kind`: vla, or
# LeRobot's policy type) on a device type where this is at least AUTO_MIN, and trains eager elsewhere
MEASURED: dict[tuple[str, str], tuple[float, str]] = {
    ("vla", "cpu"): (1.033, "2026-12-05, 2-core Intel Xeon, the demo's recipe (1.074 in an earlier run); GEMMs and "
                            "attention kernels are 45% of its step and compile only fuses the rest"),
    ("act", "cpu"): (0.996, "2026-12-05, 2-core Intel Xeon, ACT's defaults at 96x96; its ResNet's convolutions are "
                            "most of the step and compile does not speed them"),
    ("diffusion", "cpu"): (0.905, "2026-12-05, 2-core Intel Xeon, Diffusion's defaults at 96x96 (84x84 crops); "
                                  "its U-Net's and ResNet's convolutions are most of the step"),
}
AUTO_MIN = 1.1


def plan(requested: str, kind: str, device_type: str, has_regions: bool) -> tuple[bool, str]:
    """Whether to compile, and why; an explicit `on` that cannot be honoured is refused with the reason."""
    if requested == "off":
        return False, "off: eager"
    if not has_regions:
        if requested == "on":
            raise ValueError(f"compile=on: {kind} has no blocks roboloop compiles (its module has neither "
                             "compile_regions() nor blocks); it trains eager (compile=off or auto)")
        return False, f"auto: {kind} has no compiled regions"
    if requested == "on":
        return True, "on: requested"
    found = MEASURED.get((kind, device_type))
    if found is None:
        return False, (f"auto: no bench/compile.py measurement for {kind} on {device_type} yet; eager "
                       "(compile=on to try it)")
    speedup, where = found
    if speedup >= AUTO_MIN:
        return True, f"auto: bench/compile.py measured {speedup:.2f}x eager for {kind} on {device_type} ({where})"
    return False, (f"auto: bench/compile.py measured {speedup:.2f}x eager for {kind} on {device_type} ({where}), "
                   f"under {AUTO_MIN}x: eager")


def regions(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: what is compiled, one region each (`model.compile_regions()` where the family's
    module says, else its transformer `blocks` and `head_blocks`)."""
    own = getattr(model, "compile_regions", None)
    if own is not None:
        return list(own())
    return [*getattr(model, "blocks", []), *getattr(model, "head_blocks", [])]


def apply(model: nn.Module) -> int:
    """Compile each region in place (its parameters and state_dict keys unchanged: checkpoints are the same files);
    returns how many. Before DDP/FSDP wrap the model."""
    found = regions(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no blocks to compile")
    import torch._inductor.config as inductor

    inductor.fallback_random = True  # dropout inside a block draws from torch's generator as eager does: the same
    for block in found:              # masks, so compiled training equals eager and resumes exactly
        block.compile(dynamic=True)
    return len(found)


def counts() -> dict[str, Any]:
    """Graphs compiled so far in this process, and graph breaks (with their reasons)."""
    from torch._dynamo.utils import counters

    breaks = dict(counters.get("graph_break", {}))
    graphs = int(counters["stats"]["unique_graphs"])
    return {"graphs": graphs, "graph_breaks": sum(breaks.values()), "graph_break_reasons": list(breaks)[:5]}


def record(requested: str, on: bool, why: str, regions_compiled: int, block_types: int) -> dict[str, Any]:
    """The run record's `compile` entry; its counts are updated as the run goes (`update`)."""
    return {"requested": requested, "compiled": on, "why": why, "regions": regions_compiled,
            "block_types": block_types, "graphs": 0, "first_step_graphs": None, "recompiles": 0, "graph_breaks": 0}


def update(rec: dict[str, Any]) -> dict[str, Any]:
    """After each step: recompiles are the graphs compiled after the first step (which compiles one graph per
    distinct block shape: Diffusion's U-Net blocks of each width, the VLA's backbone and head blocks)."""
    if rec.get("compiled"):
        c = counts()
        if rec.get("first_step_graphs") is None:
            rec["first_step_graphs"] = c["graphs"]
        rec.update(graphs=c["graphs"], recompiles=c["graphs"] - rec["first_step_graphs"],
                   graph_breaks=c["graph_breaks"], graph_break_reasons=c["graph_break_reasons"])
    return rec
