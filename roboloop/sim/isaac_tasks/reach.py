"""Language-conditioned reaching in Isaac Lab (kit-less, Newton physics, CPU or GPU).

A planar two-link arm (shipped USD, see `roboloop.sim.assets`) and three coloured
balls (red, green, blue) on a table; the instruction names one colour ("reach the green
ball"). A top-down RGB camera sees the table. Success: the fingertip stays within
`success_radius` of the named ball for `success_hold` consecutive policy steps.

Three variants (registered in `roboloop.sim.isaac_tasks`):
- `Roboloop-Reach-Color-v0`: state (18) = joint positions (2), joint velocities (2), fingertip
  xy (2), red, green, blue ball xy (6), relative to the env origin, and each ball relative to the
  fingertip (6) (`relative_balls`; the egocentric vector is what makes a policy generalise to
  unseen layouts, see docs/guides/recipes.md). Action (2): a fingertip
  displacement in [-1, 1]^2, scaled by `ee_step` metres per policy step and turned into joint
  targets by damped-least-squares differential IK (end-effector delta actions, as in LIBERO,
  Bridge and Isaac Lab's `*-IK-Rel-*` reach tasks).
- `Roboloop-Reach-Color-Joint-v0`: the same scene with joint-delta actions (`action_scale` rad
  per step at |action| = 1), which a policy must learn the arm's inverse kinematics for.
- `Roboloop-Reach-Color-Vision-v0`: EE actions, but the state is the arm's own (joint positions
  and velocities, 4): the policy has to find the named ball in the camera image.
- `Roboloop-Reach-Red-v0`: the Color task with a single instruction, "reach the red ball", in every
  episode (green and blue stay as distractors): for policies that do not read language (LeRobot's ACT
  and Diffusion), which cannot tell the Color task's targets apart.

Every variant has a scripted expert (`ReachColorEnv.expert_action`, privileged: it reads the
ball positions from the simulator). It is a proportional controller with a wide linear zone
(`expert_zone`), not a bang-bang one: imitation learners smooth a saturated controller's switch
and overshoot (docs/guides/recipes.md, the ablation table).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import isaaclab.sim as sim_utils
import torch
from isaaclab.actuators import ImplicitActuatorCfg
from isaaclab.assets import ArticulationCfg, AssetBaseCfg, RigidObjectCfg
from isaaclab.envs import DirectRLEnv, DirectRLEnvCfg
from isaaclab.scene import InteractiveSceneCfg
from isaaclab.sensors import CameraCfg
from isaaclab.sim import SimulationCfg
from isaaclab.utils import configclass
from isaaclab.utils.assets import ISAACLAB_NUCLEUS_DIR
from isaaclab_newton.physics import MJWarpSolverCfg, NewtonCfg
from isaaclab_newton.renderers.newton_warp_renderer_cfg import NewtonWarpRendererCfg

from roboloop.sim.assets import ARM_REL
from roboloop.sim.factors import draw as perturb_rng
from roboloop.sim.isaac_tasks import scenes
from roboloop.sim.isaac_tasks.cameras import CAMERA_FACTORS, CameraMounts
from roboloop.sim.isaac_tasks.controllers import (
    JOINT_LIMIT,
    dls_step,
    ee_expert,
    fingertip,
    jacobian,
    joint_expert,
)

COLORS = {"red": (0.9, 0.1, 0.1), "green": (0.1, 0.8, 0.1), "blue": (0.1, 0.2, 0.9)}
COLOR_NAMES = tuple(COLORS)
BALL_RADIUS = 0.035
TABLE_TOP = 0.0


def _ball(name: str) -> RigidObjectCfg:
    return RigidObjectCfg(
        prim_path=f"{{ENV_REGEX_NS}}/{name}_ball",
        spawn=sim_utils.SphereCfg(
            radius=BALL_RADIUS,
            visual_material=sim_utils.PreviewSurfaceCfg(diffuse_color=COLORS[name]),
            rigid_props=sim_utils.UsdPhysicsRigidBodyCfg(rigid_body_enabled=True, kinematic_enabled=True),
            mass_props=sim_utils.MassCfg(mass=0.05),
        ),
        init_state=RigidObjectCfg.InitialStateCfg(pos=(0.3, 0.0, 0.1), rot=(0.0, 0.0, 0.0, 1.0)),
    )


@configclass
class ReachSceneCfg(InteractiveSceneCfg):
    arm: ArticulationCfg = ArticulationCfg(
        prim_path="{ENV_REGEX_NS}/Robot",
        spawn=sim_utils.UsdFileCfg(usd_path=f"{ISAACLAB_NUCLEUS_DIR}/{ARM_REL.removeprefix('Isaac/IsaacLab/')}",
                                   fix_root_link=True),
        init_state=ArticulationCfg.InitialStateCfg(pos=(0.0, 0.0, 0.0), joint_pos={"shoulder": 0.0, "elbow": 0.0}),
        actuators={"arm": ImplicitActuatorCfg(joint_names_expr=["shoulder", "elbow"], stiffness=60.0, damping=6.0,
                                              joint_effort_limit=50.0)},
    )
    table = AssetBaseCfg(
        prim_path="{ENV_REGEX_NS}/Table",
        spawn=sim_utils.CuboidCfg(size=(1.3, 1.3, 0.02),
                                  visual_material=sim_utils.PreviewSurfaceCfg(diffuse_color=(0.55, 0.45, 0.35))),
        init_state=AssetBaseCfg.InitialStateCfg(pos=(0.1, 0.0, -0.011)),
    )
    red_ball: RigidObjectCfg = _ball("red")
    green_ball: RigidObjectCfg = _ball("green")
    blue_ball: RigidObjectCfg = _ball("blue")
    light = AssetBaseCfg(prim_path="/World/Light", spawn=sim_utils.DomeLightCfg(intensity=2000.0))
    camera: CameraCfg | None = CameraCfg(
        prim_path="{ENV_REGEX_NS}/Camera",
        # top-down: rotate the camera's +x view axis by 90 deg about y so it looks along -z
        offset=CameraCfg.OffsetCfg(pos=(0.1, 0.0, 1.1), rot=(0.0, 0.7071068, 0.0, 0.7071068), convention="world"),
        data_types=["rgb"],
        spawn=sim_utils.PinholeCameraCfg(focal_length=18.0, focus_distance=1.0, horizontal_aperture=20.955,
                                         clipping_range=(0.05, 5.0)),
        width=64,
        height=64,
        renderer_cfg=NewtonWarpRendererCfg(),
    )


@configclass
class ReachColorEnvCfg(DirectRLEnvCfg):
    decimation = 2
    episode_length_s = 6.0  # 180 policy steps at 30 Hz
    action_space = 2
    observation_space = 18
    state_space = 0
    action_mode = "ee"  # "ee": fingertip displacement (differential IK); "joint": joint-position deltas
    action_scale = 0.08  # joint mode: rad per policy step at |action| = 1
    ee_step = 0.03  # ee mode: metres per policy step at |action| = 1
    ik_damping = 0.05  # damped least squares: lambda (m) near the singularities
    max_joint_step = 0.2  # rad: the most the IK moves a joint target in one policy step
    state_mode = "full"  # "full": joints, fingertip and balls (12, +6); "proprio": joint positions and velocities (4)
    # Also observe the privileged scene state (balls' and fingertip's xy, 8) as `privileged`, which `collect` records
    # as observation.environment_state: a training target for the image encoder (also observed when evaluating a
    # LeRobot policy trained with it as an input).
    privileged_obs = False
    relative_balls = True  # "full" also carries ball - fingertip (6): the egocentric vectors, as in Isaac Lab's tasks
    # The expert's linear zone (ee: metres of fingertip error, joint: rad of joint error) where its command is
    # proportional; beyond it the command saturates at |action| = 1.
    expert_zone = 0.10
    success_radius = 0.045  # m
    success_hold = 5  # policy steps
    # "distance": -distance to the named ball every step; "progress": its decrease this step in units of `ee_step`
    # (potential-based shaping, Ng et al. 1999, with potential -distance / ee_step: undiscounted, an episode's
    # rewards sum to the distance it closed; the action's effect is the reward itself instead of a small change
    # on top of a state-dependent level).
    # Both add `success_bonus` on success. RL fine-tuning picks one (`RLRecipe.reward`); evaluation counts success.
    reward_mode = "distance"
    success_bonus = 5.0
    reach_min, reach_max = 0.22, 0.50  # ball distance from the shoulder (m)
    min_separation = 0.14  # between balls (m)
    # Episodes an env plays on one ball layout and start pose, each naming another colour (1: a new layout every
    # episode). Demonstrations recorded with 3 show every layout with every instruction, so the layout alone
    # never tells which ball to reach and a policy must read the instruction (see `roboloop collect`).
    instructions_per_layout = 1
    # the colour every episode names (0 red, 1 green, 2 blue); -1: one per episode as above
    fixed_target = -1
    # Layouts are a pure function of (split, seed, layout number), and the k-th episode to start plays layout
    # k // instructions_per_layout: the episodes an evaluation counts are the same whatever its num_envs, and
    # `collect` records on the "train" split, so evaluation ("test") never replays a demonstrated layout.
    layout_split = "test"
    sim: SimulationCfg = SimulationCfg(
        dt=1 / 60, render_interval=decimation,
        physics=NewtonCfg(solver_cfg=MJWarpSolverCfg(njmax=8, nconmax=4, integrator="implicitfast", cone="pyramidal"),
                          num_substeps=1, debug_mode=False, use_cuda_graph=True))
    scene: ReachSceneCfg = ReachSceneCfg(num_envs=16, env_spacing=2.0, replicate_physics=True)


@configclass
class ReachColorJointEnvCfg(ReachColorEnvCfg):
    action_mode = "joint"
    expert_zone = 0.3  # rad


@configclass
class ReachRedEnvCfg(ReachColorEnvCfg):
    fixed_target = 0


@configclass
class ReachColorVisionEnvCfg(ReachColorEnvCfg):
    observation_space = 4
    state_mode = "proprio"
    privileged_obs = True


class ReachColorEnv(DirectRLEnv):
    cfg: ReachColorEnvCfg

    def __init__(self, cfg: ReachColorEnvCfg, render_mode: str | None = None, **kwargs):
        super().__init__(cfg, render_mode, **kwargs)
        self.arm = self.scene["arm"]
        self.balls = [self.scene[f"{c}_ball"] for c in COLOR_NAMES]
        self.joint_ids, _ = self.arm.find_joints(["shoulder", "elbow"])
        self.ball_xy = torch.zeros(self.num_envs, 3, 2, device=self.device)
        self.target = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        self.hold = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        self.success = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        self.last_distance = torch.zeros(self.num_envs, device=self.device)
        self.q_target = torch.zeros(self.num_envs, 2, device=self.device)
        self.colour_order = torch.zeros(self.num_envs, 3, dtype=torch.long)
        self.start_q = torch.zeros(self.num_envs, 2)
        self.episodes_started = 0  # episodes begun since the last full reset (the evaluator's counting order)
        self.scene_factor: tuple[str, float, int] | None = None  # (factor, level, seed) of scenes.py, or nominal
        self.episode = torch.zeros(self.num_envs, dtype=torch.long)  # per env: the number of the episode it plays
        self.mounts = CameraMounts({"camera": self.scene["camera"]} if "camera" in self.scene.keys() else {},  # noqa: SIM118
                                   self.num_envs)
        # what its reset applies (perturb.py): the camera factors where it has a camera
        self.scene_factors = (*scenes.SCENE_FACTORS, *(CAMERA_FACTORS if self.mounts.cameras else ()))

    # ----------------------------------------------------------------- language
    def instructions(self) -> list[str]:
        return [f"reach the {COLOR_NAMES[i]} ball" for i in self.target.tolist()]

    # ----------------------------------------------------------------- kinematics
    def joint_pos(self) -> torch.Tensor:
        return self.arm.data.joint_pos.torch[:, self.joint_ids]

    def fingertip(self) -> torch.Tensor:
        return fingertip(self.joint_pos())

    def goal(self) -> torch.Tensor:
        """(N, 2) the named ball's position."""
        return self.ball_xy[torch.arange(self.num_envs, device=self.device), self.target]

    # ----------------------------------------------------------------- MDP
    def _pre_physics_step(self, actions: torch.Tensor) -> None:
        a = actions.to(self.device).clamp(-1.0, 1.0)
        q = self.joint_pos()
        if self.cfg.action_mode == "ee":
            dq = dls_step(jacobian(q), self.cfg.ee_step * a, self.cfg.ik_damping)
            dq = dq.clamp(-self.cfg.max_joint_step, self.cfg.max_joint_step)
        else:
            dq = self.cfg.action_scale * a
        self.q_target = (q + dq).clamp(-JOINT_LIMIT, JOINT_LIMIT)

    def _apply_action(self) -> None:
        self.arm.set_joint_position_target_index(target=self.q_target, joint_ids=self.joint_ids)

    def _get_observations(self) -> dict:
        q = self.joint_pos()
        qd = self.arm.data.joint_vel.torch[:, self.joint_ids]
        if self.cfg.state_mode == "proprio":
            state = torch.cat([q, qd], dim=-1)
        else:
            tip = self.fingertip()
            parts = [q, qd, tip, self.ball_xy.reshape(self.num_envs, 6)]
            if self.cfg.relative_balls:
                parts.append((self.ball_xy - tip[:, None]).reshape(self.num_envs, 6))
            state = torch.cat(parts, dim=-1)
        obs = {"policy": state}
        if self.cfg.privileged_obs:
            obs["privileged"] = torch.cat([self.ball_xy.reshape(self.num_envs, 6), self.fingertip()], dim=-1)
        if "camera" in self.scene.keys():  # noqa: SIM118 (InteractiveScene has no __contains__)
            obs["rgb"] = self.scene["camera"].data.output["rgb"].torch[..., :3]
        return obs

    def _distance(self) -> torch.Tensor:
        return torch.linalg.norm(self.fingertip() - self.goal(), dim=-1)

    def _get_rewards(self) -> torch.Tensor:
        d = self._distance()
        bonus = self.cfg.success_bonus * self.success.float()
        if self.cfg.reward_mode == "distance":
            return -d + bonus
        if self.cfg.reward_mode != "progress":
            raise ValueError(f"reward_mode must be 'distance' or 'progress', not {self.cfg.reward_mode!r}")
        progress = (self.last_distance - d) / self.cfg.ee_step
        self.last_distance = d
        return progress + bonus

    def expert_action(self) -> torch.Tensor:
        """The scripted expert's action (N, 2) for every env's current state (privileged: true ball positions)."""
        if self.cfg.action_mode == "ee":
            return ee_expert(self.fingertip(), self.goal(), self.cfg.expert_zone)
        return joint_expert(self.joint_pos(), self.goal(), self.cfg.action_scale, self.cfg.expert_zone)

    def _get_dones(self) -> tuple[torch.Tensor, torch.Tensor]:
        near = self._distance() < self.cfg.success_radius
        self.hold = torch.where(near, self.hold + 1, torch.zeros_like(self.hold))
        self.success = self.hold >= self.cfg.success_hold
        self.extras["success"] = self.success.clone()  # read before the auto-reset clears it
        time_out = self.episode_length_buf >= self.max_episode_length - 1
        return self.success.clone(), time_out

    def _reset_idx(self, env_ids: Sequence[int] | None):
        if env_ids is None:
            env_ids = self.arm._ALL_INDICES
        super()._reset_idx(env_ids)
        ids = torch.as_tensor(env_ids, device=self.device, dtype=torch.long)
        n = len(ids)
        self.hold[ids] = 0
        q = self._next_layout(ids.cpu()).to(self.device)
        self.arm.write_joint_position_to_sim_index(position=q, joint_ids=self.joint_ids, env_ids=ids)
        self.arm.write_joint_velocity_to_sim_index(velocity=torch.zeros_like(q), joint_ids=self.joint_ids,
                                                   env_ids=ids)
        self.arm.set_joint_position_target_index(target=q, joint_ids=self.joint_ids, env_ids=ids)
        self.last_distance[ids] = torch.linalg.norm(fingertip(q) - self.goal()[ids], dim=-1)
        origins = self.scene.env_origins[ids]
        for k, ball in enumerate(self.balls):
            pose = torch.zeros(n, 7, device=self.device)
            pose[:, :2] = self.ball_xy[ids, k] + origins[:, :2]
            pose[:, 2] = TABLE_TOP + BALL_RADIUS
            pose[:, 6] = 1.0  # quaternion (x, y, z, w)
            ball.write_root_pose_to_sim_index(root_pose=pose, env_ids=ids)
        self.mounts.lay(ids.tolist(), self.episode[ids.cpu()].tolist(), self.scene_factor)

    def _next_layout(self, ids: torch.Tensor) -> torch.Tensor:
        """Targets, ball positions and start joints of the envs `ids` (in the order their episodes start): episode
        c plays layout c // k with the (c % k)-th colour of that layout's order (k = `instructions_per_layout`)."""
        k = max(1, int(self.cfg.instructions_per_layout))
        for env in ids.tolist():
            layout, slot = divmod(self.episodes_started, k)
            self.episode[env] = self.episodes_started
            self.episodes_started += 1
            g = scenes.layout_generator(str(self.cfg.layout_split), int(self.cfg.seed or 0), layout)
            order = torch.randperm(3, generator=g) if k > 1 else torch.randint(0, 3, (1,), generator=g).expand(3)
            self.colour_order[env] = order
            balls = self._sample_balls(g)
            q = torch.empty(2).uniform_(-0.6, 0.6, generator=g)
            q[1] = q[1] + torch.sign(q[1] + 1e-3) * 0.6  # start bent, away from the singularity
            target = int(order[min(slot, 2)]) if self.cfg.fixed_target < 0 else int(self.cfg.fixed_target)
            if self.scene_factor is not None and self.scene_factor[0] in scenes.SCENE_FACTORS:  # a suite's layout
                factor, level, seed = self.scene_factor
                rng = perturb_rng(seed, factor, level, self.episodes_started - 1, -2)
                balls, q = scenes.reach(factor, level, rng, balls, target, q, self.cfg.min_separation)
            self.ball_xy[env], self.start_q[env], self.target[env] = balls.to(self.device), q, target
        return self.start_q[ids].clone()

    def _sample_balls(self, g: torch.Generator) -> torch.Tensor:
        """Three ball positions in the reachable annulus, at least `min_separation` apart."""
        while True:
            r = torch.empty(3).uniform_(self.cfg.reach_min, self.cfg.reach_max, generator=g)
            th = torch.empty(3).uniform_(-0.5 * math.pi, 0.5 * math.pi, generator=g)
            xy = torch.stack([r * torch.cos(th), r * torch.sin(th)], dim=-1)
            if torch.pdist(xy).min() >= self.cfg.min_separation:
                return xy
