"""roboloop's Isaac Lab tasks (registered with gymnasium on import; importing needs isaaclab)."""

import gymnasium as gym

# task id -> the env config class in `reach` (see its docstring for what each variant observes and commands)
CONFIGS = {
    "Roboloop-Reach-Color-v0": "ReachColorEnvCfg",
    "Roboloop-Reach-Color-Joint-v0": "ReachColorJointEnvCfg",
    "Roboloop-Reach-Color-Vision-v0": "ReachColorVisionEnvCfg",
}

for _id, _cfg in CONFIGS.items():
    gym.register(id=_id, entry_point=f"{__name__}.reach:ReachColorEnv", disable_env_checker=True,
                 kwargs={"env_cfg_entry_point": f"{__name__}.reach:{_cfg}"})
