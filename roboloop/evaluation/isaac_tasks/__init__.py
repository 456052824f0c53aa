"""roboloop's Isaac Lab tasks (registered with gymnasium on import; importing needs isaaclab)."""

import importlib

import gymnasium as gym

# task id -> (module, env class, env config class); see each module's docstring for what a variant observes
TASKS = {
    "Roboloop-Reach-Color-v0": ("reach", "ReachColorEnv", "ReachColorEnvCfg"),
    "Roboloop-Reach-Color-Joint-v0": ("reach", "ReachColorEnv", "ReachColorJointEnvCfg"),
    "Roboloop-Reach-Color-Vision-v0": ("reach", "ReachColorEnv", "ReachColorVisionEnvCfg"),
    "Roboloop-Reach-Red-v0": ("reach", "ReachColorEnv", "ReachRedEnvCfg"),
    "Roboloop-SO101-PickCube-v0": ("so101", "SO101PickCubeEnv", "SO101PickCubeEnvCfg"),
}


def make_cfg(task: str):
    module, _, cfg = TASKS[task]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cfg)()


for _id, (_module, _env, _cfg) in TASKS.items():
    gym.register(id=_id, entry_point=f"{__name__}.{_module}:{_env}", disable_env_checker=True,
                 kwargs={"env_cfg_entry_point": f"{__name__}.{_module}:{_cfg}"})
