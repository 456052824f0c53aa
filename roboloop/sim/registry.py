"""The task registry: what every simulator task is, declared once by the task's own module.

A task is one module that calls `register(TaskSpec(...))` when imported: its id, its backend and the factory that
builds its batched env, what it observes and commands (LeRobot names where a robot has them), its cameras, its
success rule, whether it has a scripted expert, which scene factors its own reset or renderer applies, and whether
its initial layouts split into a training and a held-out set. The rest of roboloop asks the spec (`task(id)`) and
never compares a task id (tests/unit/test_house.py keeps it so).

Where tasks come from, in this order: roboloop's own (`BUILTIN`, roboloop/sim/tasks/), an installed package's entry
point (group `roboloop.tasks`, value a module), and the modules the operator lists in `ROBOLOOP_TASK_MODULES`
(comma-separated, importable from the process's path; as `ROBOLOOP_POLICY_FAMILIES`, never from a file a model or
dataset brings). A family of ids (`Isaac-*`: every task isaaclab_tasks registers; `lerobot:<env type>`; any other
gymnasium id) is a prefix and a function that makes the spec of one of its ids.

Declaring imports nothing heavy: the registry is read where a form is drawn or a config validated, with no torch
or simulator; the env factory (`env`, "module:function") is imported only when an env is made.
`docs/guides/add-a-task.md` walks through adding one.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ENTRY_POINTS = "roboloop.tasks"  # installed tasks: name = "package.module" (the module registers its tasks)
MODULES_ENV = "ROBOLOOP_TASK_MODULES"
BUILTIN = ("roboloop.sim.tasks.reach", "roboloop.sim.tasks.so101_pick", "roboloop.sim.tasks.pusht",
           "roboloop.sim.tasks.families")


@dataclass(frozen=True)
class TaskSpec:
    id: str
    backend: str  # what simulates it: isaaclab, mujoco, gymnasium, python, ...
    env: str  # "module:function": (spec, num_envs, device, seed, camera, overrides) -> a BatchedEnv
    description: str = ""
    success: str = ""  # the success rule in words (the env reports it per episode)
    options: Mapping[str, Any] = field(default_factory=dict)  # what the backend needs (config class, gym kwargs)
    robot_type: str = "roboloop"  # what a recording of it says (LeRobot's robot type where a real robot matches)
    state_names: tuple[str, ...] | None = None  # observation.state, in order (None: numbered)
    action_names: tuple[str, ...] | None = None  # action, in order (None: numbered)
    env_state_names: tuple[str, ...] | None = None  # observation.environment_state it can observe (None: none)
    cameras: tuple[str, ...] = ()  # observation.images.<name>
    expert: bool = False  # a scripted expert: demonstrations, DAgger's labels
    instructions: int = 1  # distinct instructions one scene layout can be given (goals it can name)
    state_locates_goal: bool = True  # False: the goal is only seen (recordings need a camera or the scene state)
    layouts: bool = False  # its initial layouts split into a training and a held-out set (layout_split)
    replays_layouts: bool = False  # an env can play a failed episode's layout again (retry_failed)
    progress_reward: bool = False  # its reward measures progress towards the goal (RL's reward=progress)
    scene_factors: tuple[str, ...] = ()  # perturbation factors its own reset or renderer applies (sim/factors.py)
    hold: str = "zero"  # the action that keeps the arm still: "joints" (its joint positions), "zero" (a zero delta)
    fingerprints: tuple[str, ...] = ()  # "module:function" -> {asset: sha256} of the assets it ships
    accepts: frozenset[str] = frozenset()  # env settings its config takes (layout_split, privileged_obs, ...)

    def names(self, kind: str, dim: int) -> list[str]:
        """The `kind` ("state", "action") names of a `dim`-wide vector: the declared ones where they fit, else
        numbered."""
        declared = self.state_names if kind == "state" else self.action_names
        return list(declared) if declared is not None and len(declared) == dim else [f"{kind}_{i}"
                                                                                    for i in range(dim)]

    def make(self, num_envs: int, device: str = "cpu", seed: int = 0, camera: bool = True,
             overrides: Mapping[str, Any] | None = None):
        """The task's batched env (roboloop.sim.protocol.BatchedEnv); `overrides` it does not accept are refused."""
        unknown = sorted(set(overrides or {}) - self.accepts)
        if unknown:
            raise ValueError(f"{self.id} does not take {', '.join(unknown)} (it takes "
                             f"{', '.join(sorted(self.accepts)) or 'no settings'})")
        return load(self.env)(self, num_envs, device, seed, camera, dict(overrides or {}))


@dataclass(frozen=True)
class Family:
    prefix: str  # ids that start with it ("" : any id no other task or family claims)
    spec_for: Callable[[str], TaskSpec]
    what: str  # how the unknown-task message names it
    examples: tuple[str, ...] = ()  # ids offered as choices in forms


_TASKS: dict[str, TaskSpec] = {}
_FAMILIES: list[Family] = []
_loaded: list[str] = []
_installed: list[str] = []  # the entry points' modules, read once per process (listing them takes ~30 ms)


def register(spec: TaskSpec) -> TaskSpec:
    """Add a task (from its module, at import). The same id twice is refused unless it is the same spec."""
    if _TASKS.get(spec.id, spec) != spec:
        raise ValueError(f"task {spec.id!r} is registered twice, differently ({_TASKS[spec.id].env}, {spec.env})")
    _TASKS[spec.id] = spec
    return spec


def register_family(family: Family) -> Family:
    if family not in _FAMILIES:
        _FAMILIES.append(family)
    return family


def load(ref: str) -> Any:
    """The attribute a "module:name" declaration names (a task module's own, never a file's)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _load_all() -> None:
    """Import the task modules once per process (and again when ROBOLOOP_TASK_MODULES names new ones)."""
    wanted = list(BUILTIN)
    if not _installed:
        from importlib.metadata import entry_points

        _installed.extend(["", *(ep.value for ep in entry_points(group=ENTRY_POINTS))])
    wanted += [m for m in _installed if m]
    wanted += [m.strip() for m in os.environ.get(MODULES_ENV, "").split(",") if m.strip()]
    for module in wanted:
        if module not in _loaded:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise ImportError(f"{MODULES_ENV} or an entry point names the task module {module!r}, which does "
                                  f"not import: {e}") from e
            _loaded.append(module)


def tasks() -> dict[str, TaskSpec]:
    """Every registered task by id (families' ids are made on demand: `task`)."""
    _load_all()
    return dict(_TASKS)


def task(task_id: str) -> TaskSpec:
    """The spec of `task_id`: a registered task, else the family whose prefix it starts with. An id in the namespace
    of registered tasks (before its first "-") that none of them is, is unknown (`UnknownTaskError`)."""
    from roboloop.errors import UnknownTaskError

    _load_all()
    if task_id in _TASKS:
        return _TASKS[task_id]
    namespaces = {t.split("-", 1)[0] for t in _TASKS if "-" in t}
    for fam in sorted(_FAMILIES, key=lambda f: -len(f.prefix)):
        if task_id.startswith(fam.prefix) and (fam.prefix or task_id.split("-", 1)[0] not in namespaces):
            return fam.spec_for(task_id)
    raise UnknownTaskError(unknown_task_message(task_id))


def choices(expert_only: bool = False) -> list[str]:
    """What a form offers: the registered tasks (with a scripted expert only, for recording), then the families'
    examples."""
    listed = [t for t, s in tasks().items() if s.expert or not expert_only]
    return listed if expert_only else listed + [e for f in _FAMILIES for e in f.examples]


def applying(factor: str) -> list[str]:
    """The registered tasks whose own reset or renderer applies the scene factor `factor`."""
    return [t for t, s in tasks().items() if factor in s.scene_factors]


def unknown_task_message(task_id: str) -> str:
    known = ", ".join(tasks())
    families = "; ".join(f.what for f in _FAMILIES if f.what)
    return f"unknown task {task_id!r}: known tasks are {known}; {families}"
