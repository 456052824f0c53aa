"""Isaac Lab backend (3.0, kit-less): any registered task through `gym.make`, Newton physics.

Isaac Lab's simulation context lives once per process: open an `IsaacLabEnv` with `with`
(or call `close()`), and run one at a time. Before isaaclab is imported,
`ISAACSIM_ASSET_ROOT` is pointed at the assets roboloop ships unless the user set it (a
cluster can point it at NVIDIA's server or a mirror).

Observation adapter: the task's `policy` observation is the state; any (N, H, W, 3|4) image
observation becomes a camera (`observation.images.<name>`, alpha dropped); a `privileged` one is
the simulator state recorded as `observation.environment_state` (the VLA's training target; an input of
LeRobot policies trained with it); instructions come from the env's `instructions()` if it has one. Success
comes from `extras["success"]`, else from a `success` termination term (manager-based tasks), else a timeout
counts as success (survival tasks such as Cartpole) if `success_on_timeout` is set.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from roboloop.sim.assets import use_shipped_assets
from roboloop.sim.protocol import Obs, StepResult
from roboloop.sim.registry import TaskSpec
from roboloop.sim.registry import task as task_spec


def make(spec: TaskSpec, num_envs: int, device: str, seed: int, camera: bool, overrides: dict[str, Any]):
    """A task's env on Isaac Lab (the registry's factory: `env="roboloop.sim.isaac:make"`)."""
    physics = overrides.pop("physics", "newton_mjwarp")
    return IsaacLabEnv(spec.id, num_envs=num_envs, device=device, seed=seed, physics=physics, camera=camera,
                       overrides=overrides)


def _import_isaaclab(spec: TaskSpec):
    """gymnasium, Isaac Lab's `launch_simulation` and (for Isaac Lab's own tasks) `resolve_task_config`; a task that
    declares its own config class skips `isaaclab_tasks`, whose import walks every task package (~1.2 s of each
    simulator's start here)."""
    use_shipped_assets()
    resolve_task_config: Any = None
    try:
        import gymnasium as gym
        from isaaclab.app import launch_simulation

        if "cfg" not in spec.options:
            import isaaclab_tasks  # noqa: F401  (registers Isaac Lab's tasks)
            from isaaclab_tasks import utils as task_utils

            resolve_task_config = task_utils.resolve_task_config
        else:
            from roboloop.sim.isaac_tasks import register_with_gym

            register_with_gym(spec)
    except ImportError as e:
        raise ImportError("the Isaac Lab backend needs isaaclab 3.0: pip install 'roboloop[sim]'") from e
    return gym, launch_simulation, resolve_task_config


class IsaacLabEnv:
    def __init__(self, task: str, num_envs: int = 16, device: str = "cpu",
                 seed: int = 0, physics: str = "newton_mjwarp", camera: bool = True, success_on_timeout: bool = False,
                 overrides: dict[str, Any] | None = None):
        self.spec = task_spec(task)
        gym, launch_simulation, resolve_task_config = _import_isaaclab(self.spec)
        self.task, self.num_envs, self.device = task, num_envs, device
        if "cfg" in self.spec.options:
            from roboloop.sim.isaac_tasks import make_cfg

            cfg = make_cfg(task)
            if not camera:
                for name in ("camera", "front", "wrist"):
                    if hasattr(cfg.scene, name):
                        setattr(cfg.scene, name, None)
        else:
            cfg, _ = resolve_task_config(task, "", overrides=(f"physics={physics}",))
        cfg.scene.num_envs = num_envs
        cfg.sim.device = device
        cfg.seed = seed
        for k, v in (overrides or {}).items():
            setattr(cfg, k, v)
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(launch_simulation(cfg, {"device": device, "visualizer": []}))
        try:
            if "cuda" not in device:
                from roboloop.sim import cpu_graph

                cpu_graph.enable()  # the step replayed from C++, as Isaac Lab does on CUDA (see the module)
            self.env = gym.make(task, cfg=cfg)
        except BaseException:
            self._stack.close()
            raise
        self.u = self.env.unwrapped
        space = self.u.single_action_space if hasattr(self.u, "single_action_space") else self.u.action_space
        self.action_dim = int(space.shape[-1])
        low = torch.as_tensor(getattr(space, "low", -1.0), dtype=torch.float32).reshape(-1)[-self.action_dim:]
        high = torch.as_tensor(getattr(space, "high", 1.0), dtype=torch.float32).reshape(-1)[-self.action_dim:]
        self.action_low = torch.where(torch.isfinite(low), low, torch.full_like(low, -1.0))
        self.action_high = torch.where(torch.isfinite(high), high, torch.full_like(high, 1.0))
        self.fps = round(1.0 / self.u.step_dt)
        self._backend = f"isaaclab-{physics}-{device}"
        self.success_on_timeout = success_on_timeout

    @property
    def backend(self) -> str:
        """Isaac Lab, its physics and device; `+graph` once a CPU step was replayed as a Warp graph."""
        from roboloop.sim import cpu_graph

        return self._backend + ("+graph" if "cuda" not in self.device and cpu_graph.replays() else "")

    def _obs(self, raw: dict) -> Obs:
        state = raw["policy"]
        images = {}
        for k, v in raw.items():
            if k not in ("policy", "privileged") and isinstance(v, torch.Tensor) and v.ndim == 4 \
                    and v.shape[-1] in (3, 4):
                img = v[..., :3]
                if img.dtype != torch.uint8:
                    img = (img.float().clamp(0, 1) * 255).to(torch.uint8) if img.is_floating_point() else \
                        img.to(torch.uint8)
                # The sensor's output buffer is rewritten in place every step: keep a copy, or every frame
                # recorded for videos, rollouts and demonstrations would be the latest one.
                images["observation.images." + ("top" if k == "rgb" else k)] = img.to("cpu", copy=True)
        if isinstance(state, dict):  # manager-based groups with concatenation off
            state = torch.cat([t.flatten(1) for t in state.values()], dim=-1)
        instr = self.u.instructions() if hasattr(self.u, "instructions") else [""] * self.num_envs
        env_state = raw["privileged"].float().cpu() if "privileged" in raw else None
        return Obs(state.float().cpu(), images, instr, env_state)

    def reset(self, seed: int | None = None) -> Obs:
        if hasattr(self.u, "episodes_started"):
            self.u.episodes_started = 0  # a full reset starts the episode numbering (and the layouts) again
        raw, _ = self.env.reset(seed=seed)
        return self._obs(raw)

    @property
    def scene_factors(self) -> tuple[str, ...]:
        """The scene factors this task's own reset applies (isaac_tasks/scenes.py: the layout, and on the SO-101 the
        distractors and the cube's colour, and where it has cameras their mounts and focal lengths: see perturb.py)."""
        from roboloop.sim.isaac_tasks.scenes import SCENE_FACTORS

        return tuple(getattr(self.u, "scene_factors", SCENE_FACTORS)) if hasattr(self.u, "scene_factor") else ()

    def perturb_scene(self, factor: str | None, level: float = 0.0, seed: int = 0) -> None:
        """Episodes laid out from the next reset on with a scene factor, or nominal (None)."""
        if factor is not None and factor not in self.scene_factors:
            raise ValueError(f"perturb: {self.task} cannot apply {factor} (its own reset applies: "
                             f"{', '.join(self.scene_factors) or 'none'})")
        if hasattr(self.u, "scene_factor"):
            self.u.scene_factor = None if factor is None else (factor, float(level), int(seed))

    def _success(self, extras: dict, terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
        if "success" in extras:
            return torch.as_tensor(extras["success"]).bool().cpu()
        tm = getattr(self.u, "termination_manager", None)
        if tm is not None and "success" in getattr(tm, "active_terms", []):
            return tm.get_term("success").bool().cpu()
        if self.success_on_timeout:
            return (truncated & ~terminated).bool().cpu()
        raise ValueError(f"task {self.task} reports no success signal (extras['success'] or a 'success' "
                         "termination term); pass success_on_timeout=True for survival tasks")

    def step(self, actions: torch.Tensor) -> StepResult:
        raw, rew, term, trunc, extras = self.env.step(actions.to(self.u.device))
        done = (term | trunc).bool().cpu()
        success = self._success(extras, term.cpu(), trunc.cpu()) & done
        return StepResult(self._obs(raw), rew.float().cpu(), done, success)

    def expert(self, obs: Obs) -> torch.Tensor | None:
        """The task's scripted expert for every env's current state (`obs` must be this env's latest, all envs)."""
        if not hasattr(self.u, "expert_action"):
            return None
        if obs.state.shape[0] != self.num_envs:
            raise ValueError(f"the expert acts on all {self.num_envs} envs at once, got {obs.state.shape[0]} states")
        return self.u.expert_action().float().cpu()

    def hold_action(self, obs: Obs) -> torch.Tensor:
        """The action that keeps the arm where it is (what a robot does while its next chunk is computed): the
        current joint positions for the SO-101's absolute targets, zero for the reach tasks' and other tasks' deltas."""
        if self.spec.hold == "joints":
            return obs.state[:, :self.action_dim].float().cpu()
        return torch.zeros(obs.state.shape[0], self.action_dim)

    def close(self) -> None:
        try:
            self.env.close()
        finally:
            self._stack.close()

    def __enter__(self) -> IsaacLabEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
