"""Families of task ids made on demand: Isaac Lab's own tasks (`Isaac-*`, whatever isaaclab_tasks registers),
LeRobot's environments (`lerobot:<env type>[?option=value&...]`, its env configs' gym ids, kwargs and feature
names) and any other gymnasium id (a package that registers it must be importable)."""

from roboloop.sim.registry import Family, TaskSpec, register_family


def isaac(task_id: str) -> TaskSpec:
    return TaskSpec(id=task_id, backend="isaaclab", env="roboloop.sim.isaac:make",
                    description="Isaac Lab's own task (isaaclab_tasks)", success="its `success` termination term",
                    accepts=frozenset({"physics"}))


def lerobot(task_id: str) -> TaskSpec:
    return TaskSpec(id=task_id, backend="gymnasium", env="roboloop.sim.gym_env:make",
                    description="an environment from LeRobot's env configs", success="info is_success",
                    options={"lerobot_env": task_id.split(":", 1)[1]})


def gymnasium(task_id: str) -> TaskSpec:
    return TaskSpec(id=task_id, backend="gymnasium", env="roboloop.sim.gym_env:make",
                    description="a gymnasium id", success="info is_success or success")


register_family(Family("Isaac-", isaac, "any Isaac-* task that isaaclab_tasks registers (e.g. "
                       "Isaac-Cartpole-Direct-v0)"))
register_family(Family("lerobot:", lerobot, "lerobot:<env type> for LeRobot's own environments",
                       examples=("lerobot:pusht", "lerobot:pusht?obs_type=environment_state_agent_pos")))
register_family(Family("", gymnasium, "any other gymnasium id its package registers"))
