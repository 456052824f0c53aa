"""Perturbation suites: the same evaluation episodes with one named factor changed, so a model's drop from nominal is
paired episode by episode across models.

A factor is applied between the simulator and the policy (`Perturbed`, a BatchedEnv around the task's env): what
the policy observes (state noise, camera frames dropped, delayed, shifted, darker or brighter) or what the robot does
with an action (noise, a weaker or stiffer response). Each draw is a pure function of (seed, factor, level, episode
number, step in the episode): the episode numbers are the Evaluator's (start order, which does not depend on the
policy), so two models meet the same perturbation on the same episode, whatever `num_envs`.

    FACTORS[name] = Factor(levels, what)          the suites (roboloop/sim/factors.py: declared and parsed there);
                                                  `parse("obs_noise=0.02,frame_drop")` picks from them
    Perturbed(env, factor, level, seed)           the env with one factor applied
    summarise(nominal, runs, extra) -> {factor: {level: {success_rate, ci_low, ci_high, drop, lost, gained,
                                                         changed_initial}}}

The scene factors are applied by the task itself, which lists them (`env.scene_factors`; a task that cannot apply one
refuses it by name): `object_pose` and `arm_pose` by its reset (isaac_tasks/scenes.py: the object and the arm start
beyond the range the task trains on, seen by the physics, the cameras and the expert alike), `camera_pose` and
`camera_fov` by its renderer (each camera's mount moved and turned, its focal length scaled, and the scene rendered
again: Isaac Lab's tasks through isaac_tasks/cameras.py, MuJoCo-SO101-PickCube-v0 through mujoco_so101.py), and
`lighting` by MuJoCo-SO101-PickCube-v0's renderer only (Isaac Lab's dome light is one for all envs). What a wrapper can
do on any task is named, not passed off as re-rendering: `camera_shift` moves the rendered image (a camera translated
parallel to its image plane, no parallax) and `brightness` scales it (no shadows).
`instruction` rewords what a language-conditioned policy is told (a policy that reads no instruction is unaffected by
it, as it should be). The SO-101 task's reset also applies `distractors` (cubes of other colours placed on the table
beside an unchanged layout; they wait under the table otherwise) and `colour_swap` (the cube's hue turned, through
the Newton model's shape colours that Isaac Lab's renderer reads).
"""

from __future__ import annotations

import numpy as np
import torch

from roboloop.binomial import wilson
from roboloop.sim.factors import FACTORS, RENDERED, Factor, draw, parse, renders  # noqa: F401  (declared there)
from roboloop.sim.protocol import BatchedEnv, Obs, StepResult

# paraphrases of the tasks' own wording (reach the red ball; pick up the cube): level 1 swaps the verb, level 2 the
# noun too and wraps the sentence
VERBS = {"reach": ("touch", "go to", "move to", "point at"), "pick up": ("grab", "lift", "take")}
NOUNS = {"ball": ("sphere", "orb", "dot"), "cube": ("block", "box")}
WRAPS = ("please {} now", "{}, slowly", "can you {}?")


class Perturbed:
    """`env` with one factor at one level. Episode numbers follow the Evaluator's rule: the first `num_envs` are
    0..N-1, then each env that finishes (in env order) starts the next number. `share` < 1: only that share of the
    episodes meets the factor, drawn per episode (recording demonstrations partly under it: `roboloop collect
    --perturb`); a scene factor lays out every episode (share 1 only)."""

    def __init__(self, env: BatchedEnv, factor: str, level: float, seed: int, share: float = 1.0):
        if factor not in FACTORS:
            raise ValueError(f"unknown factor {factor!r}")
        self.env, self.factor, self.level, self.seed, self.share = env, factor, float(level), seed, float(share)
        self.kind = FACTORS[factor].acts_on
        if self.kind == "scene" and self.share < 1:
            raise ValueError(f"perturb: {factor} lays out every episode the task resets; a share of them "
                             f"({share:g}) is not possible: record the nominal and the perturbed episodes apart")
        self._scene = getattr(env, "perturb_scene", None)  # the task's own reset or renderer applies it
        if self.kind == "scene":  # refused before any episode runs where the task cannot apply it
            if factor not in getattr(env, "scene_factors", ()):
                from roboloop.sim.registry import applying

                raise ValueError(f"perturb: {factor} is applied by the task's own reset or renderer; {env.task} "
                                 f"applies {', '.join(getattr(env, 'scene_factors', ())) or 'none'} (the tasks that "
                                 f"apply {factor}: {', '.join(applying(factor)) or 'none'})")
            self._lay(None)
        self.num_envs, self.action_dim, self.fps = env.num_envs, env.action_dim, env.fps
        self.action_low, self.action_high = env.action_low, env.action_high
        self.backend, self.task = env.backend, env.task
        n = env.num_envs
        self.number = np.arange(n)
        self.t = np.zeros(n, dtype=int)
        self.started = n
        self.frames: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]  # per env: last shown / history
        self.history: list[list[dict[str, torch.Tensor]]] = [[] for _ in range(n)]

    def _lay(self, *factor: object) -> None:
        """The task's reset lays its episodes out with `factor` (factor, level, seed), or nominally (None)."""
        if self._scene is not None:
            self._scene(*factor)

    def _draw(self, i: int) -> np.random.Generator:
        return draw(self.seed, self.factor, self.level, int(self.number[i]), int(self.t[i]))

    def _met(self) -> list[int]:
        """The envs whose episodes meet the factor now."""
        return [i for i in range(self.num_envs) if self._on(i)]

    def _on(self, i: int) -> bool:
        """Whether env `i`'s episode meets the factor (always, unless only a share of episodes does)."""
        return self.share >= 1 or draw(self.seed, self.factor, self.level, int(self.number[i]), -3).random() < \
            self.share

    def reset(self, seed: int | None = None) -> Obs:
        if self.kind == "scene":  # the task lays out every episode from here on with the factor (until `release`)
            self._lay(self.factor, self.level, self.seed)
        obs = self.env.reset(seed=seed)
        n = self.num_envs
        self.number, self.t, self.started = np.arange(n), np.zeros(n, dtype=int), n
        self.frames = [{} for _ in range(n)]
        self.history = [[] for _ in range(n)]
        return self._observe(obs)

    def step(self, actions: torch.Tensor) -> StepResult:
        if self.kind == "action":
            actions = self._act(actions)
        res = self.env.step(actions)
        self.t += 1
        for i in res.done.nonzero().flatten().tolist():  # the Evaluator's numbering: env order
            self.number[i], self.started, self.t[i] = self.started, self.started + 1, 0
            self.frames[i], self.history[i] = {}, []
        return StepResult(self._observe(res.obs), res.reward, res.done, res.success)

    def _act(self, actions: torch.Tensor) -> torch.Tensor:
        a = actions.clone()
        if self.factor == "actuator_gain":
            return a * torch.tensor([self.level if self._on(i) else 1.0 for i in range(self.num_envs)],
                                    dtype=a.dtype, device=a.device)[:, None]
        half = (self.action_high - self.action_low).to(a) / 2
        for i in self._met():
            noise = self._draw(i).standard_normal(self.action_dim)
            a[i] += torch.as_tensor(noise, dtype=a.dtype) * self.level * half
        return torch.maximum(torch.minimum(a, self.action_high.to(a)), self.action_low.to(a))

    def _observe(self, obs: Obs) -> Obs:
        if self.kind == "state":
            state = obs.state.clone()
            for i in self._met():
                state[i] += torch.as_tensor(self._draw(i).standard_normal(state.shape[1]), dtype=state.dtype,
                                            device=state.device) * self.level
            return Obs(state, obs.images, obs.instructions, obs.env_state, obs.past)
        if self.kind == "images" and obs.images:
            images = {k: v.clone() for k, v in obs.images.items()}
            for i in self._met():
                now = {k: v[i] for k, v in obs.images.items()}
                if self.factor == "frame_delay":  # this episode's frames so far; the one `level` steps back
                    self.history[i] = [*self.history[i], now][-(int(self.level) + 1):]
                    now = self.history[i][0]
                for k in images:
                    images[k][i] = self._image(i, k, now[k])
            return Obs(obs.state, images, obs.instructions, obs.env_state, obs.past)
        if self.kind == "instruction" and obs.instructions:
            said = [self._reword(i, text) if self._on(i) else text for i, text in enumerate(obs.instructions)]
            return Obs(obs.state, obs.images, said, obs.env_state, obs.past)
        return obs

    def _reword(self, i: int, text: str) -> str:
        """Env `i`'s instruction as this episode's paraphrase (one draw per episode, the goal's words kept)."""
        rng = draw(self.seed, self.factor, self.level, int(self.number[i]), -1)
        for old, new in VERBS.items():
            if text.startswith(old + " "):
                text = str(rng.choice(new)) + text[len(old):]
        if self.level >= 2:
            words = text.split(" ")
            words = [str(rng.choice(NOUNS[w])) if w in NOUNS else w for w in words]
            text = str(rng.choice(WRAPS)).format(" ".join(words))
        return text

    def _image(self, i: int, key: str, frame: torch.Tensor) -> torch.Tensor:
        """Env `i`'s camera `key` as the policy sees it now ((H, W, 3) uint8)."""
        if self.factor == "frame_delay":
            return frame
        if self.factor == "frame_drop":
            shown = self.frames[i].get(key)
            if shown is not None and self._draw(i).random() < self.level:
                return shown
            self.frames[i][key] = frame
            return frame
        if self.factor == "camera_shift":
            angle = draw(self.seed, self.factor, self.level, int(self.number[i]), -1).uniform(0, 2 * np.pi)
            dy, dx = round(self.level * np.sin(angle)), round(self.level * np.cos(angle))
            p, (h, w) = int(abs(self.level)) + 1, frame.shape[:2]
            img = torch.nn.functional.pad(frame.permute(2, 0, 1)[None].float(), (p, p, p, p), mode="replicate")
            out = img[0, :, p - dy:p - dy + h, p - dx:p - dx + w]  # content moved by (dy, dx), edges repeated
            return out.permute(1, 2, 0).to(frame.dtype)
        return (frame.float() * self.level).clamp(0, 255).to(torch.uint8)  # brightness

    def expert(self, obs: Obs) -> torch.Tensor | None:
        return self.env.expert(obs)

    def hold_action(self, obs: Obs) -> torch.Tensor:
        held = getattr(self.env, "hold_action", None)
        return held(obs) if held is not None else torch.zeros(obs.state.shape[0], self.action_dim)

    def release(self) -> None:
        """The wrapped env as it was: the task lays out nominal scenes again (the env stays open)."""
        if self.kind == "scene":
            self._lay(None)

    def close(self) -> None:
        self.release()
        self.env.close()


def paired(nominal: list[dict], eps: list[dict]) -> dict:
    """One run against the nominal one on the numbered episodes both played: success with its Wilson interval and
    the paired change (drop = nominal rate - this rate; lost: nominal successes that failed; gained: the reverse)."""
    base = {e["index"]: bool(e["success"]) for e in nominal}
    got = {e["index"]: bool(e["success"]) for e in eps}
    common = sorted(set(base) & set(got))
    k, n = sum(got[i] for i in common), len(common)
    lo, hi = wilson(k, n)
    return {"success_rate": k / n, "ci_low": lo, "ci_high": hi, "episodes": n,
            "drop": sum(base[i] for i in common) / n - k / n,
            "lost": sum(base[i] and not got[i] for i in common), "gained": sum(got[i] and not base[i] for i in common),
            "outcomes": "".join("01"[got[i]] for i in common)}


def changed(nominal: str | None, run: str | None) -> int | None:
    """How many episodes began from another initial state than nominal's (as the policy met it: the state vector and
    the instruction; `initial_states` digests, 8 hex digits each, in episode order); None where either is unknown."""
    if not nominal or not run:
        return None
    a, b = [[s[i:i + 8] for i in range(0, len(s), 8)] for s in (nominal, run)]
    return sum(x != y for x, y in zip(a, b, strict=False))


def summarise(nominal: list[dict], runs: dict[tuple[str, float], list[dict]],
              extra: dict[tuple[str, float], dict] | None = None) -> dict[str, dict[str, dict]]:
    """Per factor and level: `paired` against the nominal run, with what `extra` adds to the cell:
    `changed_initial` (episodes whose initial state the factor changed where the state carries the scene: a scene
    factor changes them, an image or action factor does not), and for a run that stopped early against the
    champion its `looks` and `stopped_early` (the gate's test of that cell spends alpha / looks)."""
    out: dict[str, dict[str, dict]] = {}
    for (factor, level), eps in runs.items():
        cell = {"changed_initial": None, **(extra or {}).get((factor, level), {})}
        out.setdefault(factor, {})[f"{level:g}"] = {**paired(nominal, eps), **cell}
    return out


def worst(perturbations: dict[str, dict[str, dict]]) -> tuple[str, str] | None:
    """(factor, level) with the largest drop; None where none dropped."""
    cells = [(v["drop"], f, lv) for f, levels in perturbations.items() for lv, v in levels.items()]
    best = max(cells) if cells else None
    return (best[1], best[2]) if best is not None and best[0] > 0 else None
