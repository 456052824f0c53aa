"""Language-conditioned reaching (Isaac Lab, kit-less): a planar two-link arm and three coloured balls; the
instruction names one. Four variants of one scene (the env: roboloop/sim/isaac_tasks/reach.py)."""

from roboloop.sim.registry import TaskSpec, register

JOINTS = ("q_shoulder", "q_elbow", "qd_shoulder", "qd_elbow")
FULL = (*JOINTS, "tip_x", "tip_y", "red_x", "red_y", "green_x", "green_y", "blue_x", "blue_y",
        "red_dx", "red_dy", "green_dx", "green_dy", "blue_dx", "blue_dy")
# what the `privileged` observation holds (ReachColorEnvCfg.privileged_obs): the balls' and the fingertip's xy
ENV_STATE = ("red_x", "red_y", "green_x", "green_y", "blue_x", "blue_y", "tip_x", "tip_y")
EE, JOINT = ("d_tip_x", "d_tip_y"), ("d_shoulder", "d_elbow")
MODULE = "roboloop.sim.isaac_tasks.reach"
SUCCESS = "the fingertip stays within 4.5 cm of the named ball for 5 consecutive policy steps (6 s episodes)"


def _reach(task_id: str, cfg: str, description: str, state=FULL, action=EE, instructions: int = 3,
           state_locates_goal: bool = True) -> TaskSpec:
    return register(TaskSpec(
        id=task_id, backend="isaaclab", env="roboloop.sim.isaac:make", description=description, success=SUCCESS,
        options={"entry": f"{MODULE}:ReachColorEnv", "cfg": f"{MODULE}:{cfg}"}, robot_type="roboloop_reach_arm",
        state_names=state, action_names=action, env_state_names=ENV_STATE, cameras=("top",), expert=True,
        instructions=instructions, state_locates_goal=state_locates_goal, layouts=True, progress_reward=True,
        scene_factors=("object_pose", "arm_pose", "camera_pose", "camera_fov"), hold="zero",
        fingerprints=("roboloop.sim.assets:hashes",),
        accepts=frozenset({"layout_split", "instructions_per_layout", "privileged_obs", "reward_mode"})))


COLOR = _reach("Roboloop-Reach-Color-v0", "ReachColorEnvCfg",
               "reach the ball the instruction names; the state holds the joints, the fingertip and the balls, the "
               "action moves the fingertip (differential IK)")
COLOR_JOINT = _reach("Roboloop-Reach-Color-Joint-v0", "ReachColorJointEnvCfg",
                     "the Color task with joint-delta actions (the policy learns the arm's inverse kinematics)",
                     action=JOINT)
COLOR_VISION = _reach("Roboloop-Reach-Color-Vision-v0", "ReachColorVisionEnvCfg",
                      "the Color task with the arm's own state only: the balls are seen by the camera",
                      state=JOINTS, state_locates_goal=False)
RED = _reach("Roboloop-Reach-Red-v0", "ReachRedEnvCfg",
             "the Color task always naming the red ball (for policies that read no language)", instructions=1)
