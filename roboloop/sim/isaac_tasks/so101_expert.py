"""The SO-101 pick's scripted expert, in plain torch: what it reads of a simulator is `Sensors`, so Isaac Lab's task
(`so101.SO101PickCubeEnv.expert_action`) and the MuJoCo twin (`roboloop.sim.mujoco_so101`) drive their arms
with the same controller, and a gap between the two simulators' successes is the simulators', not the experts'.

It moves the point between the jaw pads by damped least squares on the simulator's Jacobian, with a PI term on the
joints (the soft servos sag under gravity): above the cube, down as it lines up, close, lift. It keeps each env's
phase, its integral term and its jaw command; `reset(ids)` starts an episode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from roboloop.sim.isaac_tasks.scenes import SO101_CUBE as CUBE
from roboloop.sim.isaac_tasks.scenes import to_lerobot


@dataclass(frozen=True)
class ExpertSettings:
    """The expert's gains and thresholds (the Isaac task's config carries the same names)."""
    ik_damping: float = 0.02
    grasp_tilt: float = 0.3  # rad: the jaws point this far out from straight down
    jaw_step: float = 8.0  # gripper units (0-100) per policy step
    max_joint_step: float = 0.06  # rad per policy step
    expert_ki: float = 0.1  # the integral gain of the expert's joint bias (leaky)
    expert_labels_others: bool = False  # DAgger: it labels states another actor drives (SO101PickCubeEnvCfg says how)
    grasp_tolerance: float = 0.007  # m: close the jaws when the grasp point is this near the cube's centre
    careful_step: float = 0.01  # m per step near the cube (descending, closing, lifting)
    held_radius: float = 0.035  # the cube's centre within this of the grasp point counts as held
    lift_height: float = 0.05  # m above the resting cube

    @classmethod
    def of(cls, cfg) -> ExpertSettings:
        return cls(**{k: getattr(cfg, k) for k in cls.__dataclass_fields__})


class Sensors(NamedTuple):
    """What the expert reads, for N envs, in the arm's base frame (metres, radians)."""
    q: torch.Tensor  # (N, 6) joint positions, the jaw last
    q_target: torch.Tensor  # (N, 6) the joint targets applied
    settled: torch.Tensor  # (N,) bool: the arm's joints all slower than 0.3 rad/s
    tip: torch.Tensor  # (N, 3) the grasp point (between the jaw pads)
    rot: torch.Tensor  # (N, 3, 3) the gripper link's orientation (columns: its axes in the base frame)
    offset: torch.Tensor  # (N, 3) the grasp point from the gripper link's origin, in the base frame
    jac: torch.Tensor  # (N, 6, 5) the gripper link origin's Jacobian (linear, then angular) over the arm's joints
    cube: torch.Tensor  # (N, 3) the cube's centre
    cube_pose: torch.Tensor  # (N, 4) x, y, z, yaw of the cube at the episode's start


class SO101Expert:
    def __init__(self, num_envs: int, device, settings: ExpertSettings):
        n, self.device, self.cfg = num_envs, device, settings
        self.phase = torch.zeros(n, dtype=torch.long, device=device)  # approach, descend, close, lift
        self.phase_steps = torch.zeros(n, dtype=torch.long, device=device)
        self.jaw_cmd = torch.zeros(n, device=device)  # the gripper command (LeRobot units)
        self.arm_bias = torch.zeros(n, 5, device=device)  # the integral term (rad)
        self.grasp_goal = torch.zeros(n, 3, device=device)

    def reset(self, ids: torch.Tensor) -> None:
        self.phase[ids] = 0
        self.phase_steps[ids] = 0
        self.jaw_cmd[ids] = 0.0
        self.arm_bias[ids] = 0.0

    def act(self, s: Sensors) -> torch.Tensor:
        """The joint targets (N, 6) in LeRobot units for this step; advances each env's phase."""
        p = self.phase
        goal, xy_err, above = self._goal(s.cube, s.tip, p)
        self.phase_steps += 1
        self._next_phase(s.cube, s.tip, p, goal, xy_err, above, s.settled)
        return self._targets(goal, s)

    def _goal(self, cube: torch.Tensor, tip: torch.Tensor, p: torch.Tensor) -> tuple:
        """Where the jaws go in the phase each env is in: above the cube, down onto it, or lifted; with the
        horizontal error and the point above."""
        dev = self.device
        # the grasp goal is fixed when the descent starts (chasing a cube the pads nudge would push it away); a
        # labeller of another actor's states takes the cube where it is until the jaws close (labels of the state)
        others = self.cfg.expert_labels_others
        self.grasp_goal = torch.where(((p <= 1) if others else (p == 0))[:, None], cube, self.grasp_goal)
        above = self.grasp_goal + torch.tensor([0.0, 0.0, 0.07], device=dev)
        lifted = self.grasp_goal.clone()
        lifted[:, 2] = CUBE / 2 + self.cfg.lift_height + 0.04
        # descending, the height comes down only as the jaws line up over the cube (a straight, vertical approach)
        xy_err = torch.linalg.norm(self.grasp_goal[:, :2] - tip[:, :2], dim=-1)
        down = self.grasp_goal.clone()
        down[:, 2] = down[:, 2] + (4.0 * (xy_err - 0.003)).clamp(0.0, 0.07)
        goal = torch.where((p == 0)[:, None], above, torch.where((p == 3)[:, None], lifted, down))
        return goal, xy_err, above

    def _next_phase(self, cube, tip, p, goal, xy_err, above, settled) -> None:
        """The phase each env is in after this step (and its step counter)."""
        others = self.cfg.expert_labels_others
        err = torch.linalg.norm(goal - tip, dim=-1)
        # its own runs close once settled there; the jaws of an actor that keeps moving close on the cube too
        at_cube = (p == 1) & (torch.linalg.norm(self.grasp_goal - tip, dim=-1) < self.cfg.grasp_tolerance) \
            & (settled | others)
        nxt = ((p == 0) & (err < 0.015)) | at_cube \
            | ((p == 2) & (self.jaw_cmd <= 0) & (self.phase_steps > 70 / self.cfg.jaw_step + 8))
        # stuck on the way down: back above the cube, try again (its own runs; a timer is no label of a state)
        retry = (p == 1) & (self.phase_steps > 60) & (not others)
        # the other actor left the cube (or never had it) while the labels were closing or lifting: descend again
        lost = (p >= 2) & (torch.linalg.norm(cube - tip, dim=-1) > self.cfg.held_radius) & others
        phase = torch.where(retry, torch.zeros_like(p),
                            torch.where(lost, torch.ones_like(p), torch.where(nxt & (p < 3), p + 1, p)))
        if others:
            # the phase the state is in, however the actor got there: over the cube below the approach height is
            # the expert's own descent (its runs pass there only descending), so the labels descend and close
            # instead of sending the arm back up with open jaws (measured: an actor closing on the cube got
            # "open" labels in 89% of its frames there, the expert's own recordings in 1%); the cube held up off
            # the table is the lift
            over = (p == 0) & (xy_err < 0.015) & (tip[:, 2] < above[:, 2] + 0.015)
            holding = (torch.linalg.norm(cube - tip, dim=-1) < self.cfg.held_radius) & (cube[:, 2] > CUBE / 2 + 0.01)
            phase = torch.where(holding, torch.full_like(p, 3), torch.where(over, torch.ones_like(p), phase))
            nxt = nxt | (phase != p)
        self.phase = phase
        self.phase_steps = torch.where(nxt | retry | lost, torch.zeros_like(self.phase_steps), self.phase_steps)

    def _targets(self, goal: torch.Tensor, s: Sensors) -> torch.Tensor:
        """The joint targets toward `goal` (IK with a PI term) and the jaw's, in LeRobot units."""
        dev, others = self.device, self.cfg.expert_labels_others
        # PI on the joints: the step the IK asks for, plus a slowly integrated bias that takes up the soft servos'
        # sag under gravity (bounded)
        speed = torch.where(self.phase == 0, 0.03, self.cfg.careful_step).to(dev)[:, None]
        dq = self._ik_step(goal, grasp_frame(s.cube_pose, self.cfg.grasp_tilt), speed, s)
        q = s.q
        if others:
            sag = (s.q_target[:, :5] - q[:, :5]).clamp(-0.2, 0.2)
            self.arm_bias = torch.where(s.settled[:, None], 0.8 * self.arm_bias + 0.2 * sag, self.arm_bias)
        else:
            self.arm_bias = (0.98 * self.arm_bias + self.cfg.expert_ki * dq).clamp(-0.2, 0.2)
        target = q.clone()
        target[:, :5] = q[:, :5] + dq + self.arm_bias
        out = to_lerobot(target)
        # the gripper opens to 70 and closes to 0 at most `jaw_step` a step (a person on a leader arm takes ~1/3 s)
        closing = self.phase >= 2
        jaw = self.jaw_cmd
        if others:  # a step on from where the actor's jaws are, not from the labeller's own last command
            held = to_lerobot(q)[:, 5]
            jaw = torch.where(closing, torch.minimum(jaw, held), torch.maximum(jaw, held))
        self.jaw_cmd = torch.where(closing, (jaw - self.cfg.jaw_step).clamp(min=0.0),
                                   (jaw + self.cfg.jaw_step).clamp(max=70.0))
        out[:, 5] = self.jaw_cmd
        return out

    def _ik_step(self, goal: torch.Tensor, rot_goal: torch.Tensor, max_step: torch.Tensor, s: Sensors) \
            -> torch.Tensor:
        """Damped least squares on the simulator's Jacobian of the grasp point: joint steps (N, 5)."""
        jac = s.jac.clone()
        jac[:, :3] = jac[:, :3] + torch.linalg.cross(jac[:, 3:], s.offset[:, :, None].expand_as(jac[:, 3:]), dim=1)
        rot_err = 0.5 * torch.linalg.cross(s.rot, rot_goal, dim=1).sum(-1)  # sum over columns of r_i x r_goal_i
        turn = rot_err.norm(dim=-1, keepdim=True).clamp(min=1e-6)
        rot_err = rot_err * (turn.clamp(max=0.3) / turn)  # at most ~0.3 rad a step
        pos_err = goal - s.tip
        step = pos_err.norm(dim=-1, keepdim=True).clamp(min=1e-6)
        pos_err = pos_err * (torch.minimum(step, max_step) / step)  # at most max_step (m) a step
        err = torch.cat([pos_err, 0.3 * rot_err], dim=-1)[:, :, None]
        w = torch.tensor([1.0, 1.0, 1.0, 0.3, 0.3, 0.3], device=self.device)[None, :, None]
        jw = jac * w
        lam = self.cfg.ik_damping ** 2 * torch.eye(6, device=self.device)
        dq = (jw.transpose(1, 2) @ torch.linalg.solve(jw @ jw.transpose(1, 2) + lam, err)).squeeze(-1)
        return dq.clamp(-self.cfg.max_joint_step, self.cfg.max_joint_step)


def grasp_frame(cube_pose: torch.Tensor, grasp_tilt: float) -> torch.Tensor:
    """(N, 3, 3) the gripper orientation that grasps the cube from above: the jaws (gripper -z) down, tilted
    `grasp_tilt` out along the arm's bearing (the 5-DoF arm's approach axis lies in its vertical plane), closing
    (gripper x) along the cube face normal nearest the arm's tangential direction (to its right, as at the home
    pose, so the wrist roll stays inside its limits), projected square to the jaws."""
    yaw, bearing = cube_pose[:, 3], torch.atan2(cube_pose[:, 1], cube_pose[:, 0])
    k = torch.round((bearing - math.pi / 2 - yaw) / (math.pi / 2))
    a = yaw + k * (math.pi / 2)
    zeros = torch.zeros_like(a)
    tilt = math.tan(grasp_tilt)
    z = torch.stack([-tilt * torch.cos(bearing), -tilt * torch.sin(bearing), torch.ones_like(a)], dim=-1)
    z = z / z.norm(dim=-1, keepdim=True)
    x = torch.stack([torch.cos(a), torch.sin(a), zeros], dim=-1)
    x = x - (x * z).sum(-1, keepdim=True) * z
    x = x / x.norm(dim=-1, keepdim=True)
    return torch.stack([x, torch.linalg.cross(z, x), z], dim=-1)  # columns
