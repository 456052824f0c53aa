"""roboloop's Isaac Lab tasks' envs (importing a task module needs isaaclab). What each task is (its id, config
class, spaces, expert, factors) is declared in roboloop/sim/tasks/; this registers it with gymnasium when an env is
made."""

from roboloop.sim.registry import TaskSpec, load, tasks


def register_with_gym(spec: TaskSpec) -> None:
    """gymnasium's id for a task that declares its env class and config class (`options` entry and cfg)."""
    import gymnasium as gym

    if spec.id not in gym.registry:
        entry, cfg = spec.options["entry"], spec.options["cfg"]
        gym.register(id=spec.id, entry_point=entry, disable_env_checker=True, kwargs={"env_cfg_entry_point": cfg})


def make_cfg(task: str):
    """A fresh env config of one of roboloop's Isaac Lab tasks."""
    return load(tasks()[task].options["cfg"])()


def isaac_tasks() -> list[str]:
    """The registered tasks with their own Isaac Lab config class."""
    return [t for t, s in tasks().items() if s.backend == "isaaclab" and "cfg" in s.options]
