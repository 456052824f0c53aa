"""PushT (gym-pusht: LeRobot's standard CPU evaluation env): push the T-shaped block onto its target, seen from
above (96x96 pixels) with the pusher's position as the state."""

from roboloop.sim.registry import TaskSpec, register

PUSHT = register(TaskSpec(
    id="gym_pusht/PushT-v0", backend="gymnasium", env="roboloop.sim.gym_env:make",
    description="push the T-shaped block onto the T-shaped target (gym-pusht, pixels and the pusher's xy)",
    success="the block covers at least 95% of the target (gym-pusht's is_success)",
    options={"module": "gym_pusht", "kwargs": {"obs_type": "pixels_agent_pos"},
             "instruction": "Push the T-shaped block onto the T-shaped target."},
    cameras=("image",)))
