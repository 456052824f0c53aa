"""Perturbation suites: the same evaluation episodes with one named factor changed, so a model's drop from nominal is
paired episode by episode across models.

A factor is applied between the simulator and the policy (`Perturbed`, a BatchedEnv around the task's env): what
the policy observes (state noise, camera frames dropped, delayed, shifted, darker or brighter) or what the robot does
with an action (noise, a weaker or stiffer response). Each draw is a pure function of (seed, factor, level, episode
number, step in the episode): the episode numbers are the Evaluator's (start order, which does not depend on the
policy), so two models meet the same perturbation on the same episode, whatever `num_envs`.

    FACTORS[name] = Factor(levels, what)          the suites; `parse("obs_noise=0.02,frame_drop")` picks from them
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

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from roboloop.binomial import wilson
from roboloop.evaluation.protocol import BatchedEnv, Obs, StepResult


@dataclass(frozen=True)
class Factor:
    levels: tuple[float, ...]
    what: str
    acts_on: str  # "state", "images", "action", "instruction" or "scene"


FACTORS: dict[str, Factor] = {
    "obs_noise": Factor((0.005, 0.02, 0.05), "Gaussian noise on the observed state (std, the state's units)", "state"),
    "action_noise": Factor((0.05, 0.15, 0.3), "Gaussian noise on the executed action (std, a fraction of each "
                           "action dimension's half range)", "action"),
    "actuator_gain": Factor((0.6, 0.8, 1.25), "the executed action scaled: a weaker (< 1) or stiffer (> 1) "
                            "response to the same command", "action"),
    "frame_drop": Factor((0.1, 0.3, 0.5), "probability at each step that the cameras' frames are the previous "
                         "ones again (a dropped frame)", "images"),
    "frame_delay": Factor((1, 2, 4), "camera frames arrive this many steps late (the state is current)", "images"),
    "camera_shift": Factor((2, 4, 8), "each camera's image moved by this many pixels in a direction drawn per "
                           "episode (a camera translated in its image plane; not re-rendered)", "images"),
    "brightness": Factor((0.6, 0.8, 1.3), "each image's brightness scaled (lighting; not re-rendered)", "images"),
    "instruction": Factor((1, 2), "the instruction reworded, drawn per episode: 1 another verb (touch the red ball), "
                          "2 another verb and noun in a longer sentence (please move over to the red sphere now); "
                          "the words that name the goal (its colour) are kept", "instruction"),
    "object_pose": Factor((0.25, 0.5, 1.0), "the object (the named ball, the cube) placed at a bearing beyond the "
                          "training range, by up to this fraction of the range's half-width (its distance kept)",
                          "scene"),
    "arm_pose": Factor((0.25, 0.5, 1.0), "the arm's start beyond the training range (the reach arm's shoulder, the "
                       "SO-101's arm joints), by up to this fraction of each range's half-width", "scene"),
    "camera_pose": Factor((1, 2, 4), "each camera re-rendered moved by this many cm and turned by this many degrees, "
                          "in directions drawn per episode and camera (in the frame it rides: the world, or the wrist "
                          "camera's link)",
                          "scene"),
    "camera_fov": Factor((0.8, 0.9, 1.1, 1.25), "each camera re-rendered with its focal length scaled by this (its "
                         "field of view narrower above 1)", "scene"),
    "lighting": Factor((0.5, 0.75, 1.5), "the scene re-rendered with its light scaled by this", "scene"),
    "distractors": Factor((1, 2, 3), "this many cubes of other colours (blue, green, yellow) on the table where the "
                          "cube could be, drawn per episode (seen by the cameras, not collidable: Roboloop-SO101-"
                          "PickCube-v0)", "scene"),
    "colour_swap": Factor((60, 120, 180), "the object drawn in another colour: its hue turned by this many degrees, "
                          "one way or the other per episode (the red cube yellow or magenta, green or blue, cyan: "
                          "Roboloop-SO101-PickCube-v0)", "scene"),
}

RENDERED = ("camera_pose", "camera_fov", "lighting")  # the scene factors a task applies through its renderer


def renders(spec: str | None) -> bool:
    """Whether the suites of `spec` name a factor that only an env rendering its cameras can apply (`all` does)."""
    return bool(spec) and any(f in RENDERED for f, _ in parse(str(spec)))


# paraphrases of the tasks' own wording (reach the red ball; pick up the cube): level 1 swaps the verb, level 2 the
# noun too and wraps the sentence
VERBS = {"reach": ("touch", "go to", "move to", "point at"), "pick up": ("grab", "lift", "take")}
NOUNS = {"ball": ("sphere", "orb", "dot"), "cube": ("block", "box")}
WRAPS = ("please {} now", "{}, slowly", "can you {}?")


def parse(spec: str, scene_factors: tuple[str, ...] | None = None) -> list[tuple[str, float]]:
    """`all`, or `FACTOR[=LEVEL],...` (a factor without a level: all its levels) -> [(factor, level)]. `all` takes
    the scene factors the task applies (`scene_factors`; None: every one)."""
    out: list[tuple[str, float]] = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        if part == "all":
            out += [(n, lv) for n, f in FACTORS.items() for lv in f.levels
                    if f.acts_on != "scene" or scene_factors is None or n in scene_factors]
            continue
        name, _, level = part.partition("=")
        if name not in FACTORS:
            raise ValueError(f"perturb: unknown factor {name!r}; the factors are {', '.join(FACTORS)} (or all)")
        try:
            levels = [float(level)] if level else list(FACTORS[name].levels)
        except ValueError:
            raise ValueError(f"perturb: {part!r}: the level must be a number (e.g. {name}="
                             f"{FACTORS[name].levels[0]})") from None
        out += [(name, lv) for lv in levels]
    if not out:
        raise ValueError("perturb: no factor given (e.g. obs_noise=0.02,frame_drop or all)")
    return list(dict.fromkeys(out))


def draw(seed: int, factor: str, level: float, episode: int, step: int) -> np.random.Generator:
    """The stream of one (seed, factor, level, episode, step): step -1 is the episode's own draw (a paraphrase, a
    camera direction), -2 its scene's (the task's reset)."""
    key = hashlib.blake2b(f"{seed}/{factor}/{level}/{episode}/{step}".encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(key, "little"))


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
                raise ValueError(f"perturb: {factor} is applied by the task's own reset or renderer; {env.task} "
                                 f"applies {', '.join(getattr(env, 'scene_factors', ())) or 'none'} (roboloop's "
                                 "reach and SO-101 tasks lay out object_pose and arm_pose, the SO-101's also "
                                 "distractors and colour_swap; tasks with cameras also re-render camera_pose and "
                                 "camera_fov, MuJoCo-SO101-PickCube-v0 also lighting)")
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
