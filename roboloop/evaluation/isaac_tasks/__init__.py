"""roboloop's Isaac Lab tasks (registered with gymnasium on import; importing needs isaaclab)."""

import gymnasium as gym

gym.register(
    id="Roboloop-Reach-Color-v0",
    entry_point=f"{__name__}.reach:ReachColorEnv",
    disable_env_checker=True,
    kwargs={"env_cfg_entry_point": f"{__name__}.reach:ReachColorEnvCfg"},
)
