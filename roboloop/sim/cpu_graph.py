"""The physics step replayed as a Warp graph on the CPU, as Isaac Lab replays it as a CUDA graph on a GPU.

Isaac Lab 3.0's Newton manager (`isaaclab_newton.physics.newton_manager.NewtonManager`) captures a step (actuators,
collision, the solver's substeps, sensors) once and replays it every step when `NewtonCfg.use_cuda_graph` is set,
but only where the device name contains "cuda": on the CPU it launches each of MuJoCo Warp's kernels from Python,
~150 a substep, and packing each launch's arguments in Python costs more than most of those kernels take. Warp 1.17
captures on the CPU too (its APIC recording: `wp.ScopedCapture(device="cpu")` records the launches, and
`wp.capture_launch` replays them from C++). `enable()` lets the manager do on the CPU what the setting asks for on
CUDA, with the manager's own rules for when to capture: after the solver starts or the decimation changes, the
next step runs eagerly (lazy allocations happen outside the recording), is recorded, and the following steps
replay the recording.

The same kernels run in the same order on the same arrays, so every episode is the same as without the graph, bit
for bit (`tests/isaac/test_cpu_graph.py`: the reach task, the SO-101 pick with its contacts, and a model acting on
the vision reach task's camera; tried once more by hand: the SO-101 with both cameras and a model reading them).
`bench/eval.py` measures it: `graph_speedup` against Isaac Lab's own eager CPU step on the same episodes (its
records are in bench/results/). Camera rendering stays eager: Isaac Lab runs its CPU queries so.
`ROBOLOOP_CPU_GRAPH=0` turns it off; an evaluation's `backend` says `+graph` only when a step was replayed. (Isaac
Lab's own timer logs each capture as "CUDA graph took: ...", on the CPU too.)
"""

from __future__ import annotations

import os
from typing import Any

_state: dict[str, Any] = {"patched": False, "capturing": False, "replays": 0}


def wanted() -> bool:
    """On unless ROBOLOOP_CPU_GRAPH=0; anything else than 0 or 1 is refused."""
    value = os.environ.get("ROBOLOOP_CPU_GRAPH", "1")
    if value not in ("0", "1"):
        raise ValueError(f"ROBOLOOP_CPU_GRAPH={value!r}: 1 (replay the physics step as a Warp graph on the CPU, the "
                         "default) or 0 (Isaac Lab's eager step)")
    return value == "1"


def replays() -> int:
    """Physics steps replayed from a recording in this process."""
    return int(_state["replays"])


def enable() -> bool:
    """Patch Isaac Lab's Newton manager (once per process) so that a CPU device captures and replays the step as a
    CUDA device does; returns whether it is on. Refuses an Isaac Lab whose manager lacks the methods it extends."""
    if _state["patched"]:
        return True
    if not wanted():
        return False
    from isaaclab_newton.physics.newton_manager import NewtonManager

    needed = ("_invalidate_graph", "_capture_graph", "_simulate_full", "_simulate_physics_only",
              "_mark_transforms_changed", "_mark_particles_dirty")
    if missing := [name for name in needed if not hasattr(NewtonManager, name)]:
        raise RuntimeError(f"this Isaac Lab's NewtonManager has no {missing}: set ROBOLOOP_CPU_GRAPH=0")
    NewtonManager._invalidate_graph = classmethod(_pending(NewtonManager._invalidate_graph.__func__))
    NewtonManager._capture_graph = classmethod(_recorded(NewtonManager._capture_graph.__func__))
    for name in ("_simulate_full", "_simulate_physics_only"):
        setattr(NewtonManager, name, classmethod(_replayed(getattr(NewtonManager, name).__func__)))
    for name in ("_mark_transforms_changed", "_mark_particles_dirty"):
        setattr(NewtonManager, name, classmethod(_marked(getattr(NewtonManager, name).__func__)))
    _state["patched"] = True
    return True


def _on_cpu() -> bool:
    from isaaclab.physics import PhysicsManager

    device = PhysicsManager._device
    return device is not None and "cuda" not in str(device)


def _pending(invalidate):
    """The manager's rule for when to capture (after the solver starts or the decimation changes), the CPU allowed."""
    from isaaclab.physics import PhysicsManager
    from isaaclab_newton.physics.newton_manager import NewtonManager

    def _invalidate_graph(cls) -> None:
        invalidate(cls)
        cfg = PhysicsManager._cfg
        if _on_cpu() and cfg is not None and cfg.use_cuda_graph:
            NewtonManager._graph_capture_pending = True

    return _invalidate_graph


def _recorded(capture):
    """On the CPU, Warp's recording of what `target` launches (CUDA: the manager's own stream capture)."""
    import warp as wp
    from isaaclab.physics import PhysicsManager

    def _capture_graph(cls, target):
        if not _on_cpu():
            return capture(cls, target)
        _state["capturing"] = True
        try:
            with wp.ScopedCapture(device=str(PhysicsManager._device)) as recording:
                target()
        finally:
            _state["capturing"] = False
        return recording.graph

    return _capture_graph


def _replayed(simulate):
    """The manager's step calls `simulate` eagerly wherever its device is not CUDA: there, once a recording exists,
    replay it instead (while recording, the real thing runs)."""
    import warp as wp
    from isaaclab_newton.physics.newton_manager import NewtonManager

    def step(cls) -> None:
        graph = NewtonManager._graph
        if graph is not None and not _state["capturing"] and _on_cpu():
            wp.capture_launch(graph)
            _state["replays"] += 1
            return
        simulate(cls)

    return step


def _marked(mark):
    """As on CUDA (where the manager checks `stream.is_capturing`): a change published from inside a recording
    happens again at every replay, where no Python runs, so readers of the scene's transforms must recompute them."""
    from isaaclab_newton.physics.newton_manager import NewtonManager

    def marked(cls) -> None:
        mark(cls)
        if _state["capturing"]:
            NewtonManager.transforms_may_change_on_graph_replay = True

    return marked
