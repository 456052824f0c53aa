"""The three kinds of RL workers. Plain classes: `roboloop.rl.run` makes them Ray actors.

- `EnvWorker`: one Isaac Lab process with N vectorised envs. `collect` plays a segment of T
  decisions: for each, it asks the rollout worker for chunks (a Ray call), executes their first
  E actions, and records rewards and ends. An env whose episode ends inside a chunk auto-resets
  and holds still (zero action: no end-effector displacement) for the rest of that chunk, so all
  N envs re-plan together; the reward of the held steps is not counted.
- `RolloutWorker`: action generation with the behaviour weights, tagged with their version.
- `Learner`: the PPO update (GAE on the learner's current critic, decoupled clipped objective,
  see `roboloop.rl.objective`); hands out its weights after each update.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import torch

from roboloop.policies.obs import Obs
from roboloop.rl.config import reward_mode


def cat_obs(parts: list[Obs]) -> Obs:
    keys = parts[0].images.keys()
    return Obs(torch.cat([p.state for p in parts]), {k: torch.cat([p.images[k] for p in parts]) for k in keys},
               [s for p in parts for s in (p.instructions or [""] * p.state.shape[0])])


def take(obs: Obs, idx: torch.Tensor) -> Obs:
    return Obs(obs.state[idx], {k: v[idx] for k, v in obs.images.items()}, [obs.instructions[i] for i in idx.tolist()])


@dataclass
class Segment:
    """T decisions of one env worker's N envs."""

    worker: int
    obs: list[Obs]  # T observations, each of N envs
    last_obs: Obs
    chain: torch.Tensor  # (T, N, K+1, H, A) normalised
    logp: torch.Tensor  # (T, N) behaviour log-density
    version: torch.Tensor  # (T,) weights version that generated decision t
    reward: torch.Tensor  # (T, N) discounted sum over the executed steps
    done: torch.Tensor  # (T, N) bool
    env_steps: int
    episodes: int
    successes: int
    started: float = 0.0
    finished: float = 0.0
    returns: list[float] = field(default_factory=list)  # undiscounted return of each finished episode


def _folder(model: str | dict[str, bytes]) -> str:
    """A model folder on this worker's host: the path itself (one machine), or the driver's folder sent through Ray's
    object store (a cluster: its machines share no folder), written once into a temporary folder here."""
    if isinstance(model, str):
        return model
    import tempfile
    from pathlib import Path

    from roboloop.fsutil import check_relative

    d = Path(tempfile.mkdtemp(prefix="roboloop-rl-model-"))
    try:
        for name, data in model.items():
            check_relative(name)
            (d / name).write_bytes(data)
    except BaseException:  # a refused name or a full disk: no half-written copy left behind
        import shutil

        shutil.rmtree(d, ignore_errors=True)
        raise
    return str(d)


def _policy(model: str | dict[str, bytes], device: str, rl: dict):
    from roboloop.policies.vla import ModelPolicy  # RL is the VLA family's capability
    from roboloop.rl.policy import FlowNoisePolicy

    folder = _folder(model)
    try:
        mp = ModelPolicy(folder, device)
    finally:
        if not isinstance(model, str):  # the copy this worker wrote: read into memory, so it leaves no folder behind
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    pol = FlowNoisePolicy(mp.model, rl.get("denoise_steps"), rl["init_std"], rl["min_std"], rl["max_std"],
                          rl.get("freeze_backbone", False), rl.get("noise", "chain"),
                          rl["execute_steps"], rl.get("x0", "sample")).to(mp.device)
    return mp, pol


class EnvWorker:
    def __init__(self, index: int, task: str, num_envs: int, seed: int, execute_steps: int, gamma: float,
                 camera: bool, reward: str = "task"):
        from roboloop.sim import make_env
        from roboloop.sim.registry import task as task_spec

        self.index, self.e, self.gamma = index, execute_steps, gamma
        # training layouts: RL never sees the episodes an evaluation (the test split) will count
        overrides = {"layout_split": "train"} if task_spec(task).layouts else None
        if reward_mode(task, reward) == "progress":
            overrides = {**(overrides or {}), "reward_mode": "progress"}
        self.env = make_env(task, num_envs, "cpu", seed, camera=camera, overrides=overrides)
        self.obs = self.env.reset(seed=seed)
        self.ep_return = torch.zeros(self.env.num_envs)

    def pid(self) -> int:
        return os.getpid()

    def host(self) -> str:
        import socket

        return socket.gethostname()

    def _execute(self, actions_NHA: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, int, list[float]]:
        n = self.env.num_envs
        reward, ended = torch.zeros(n), torch.zeros(n, dtype=torch.bool)
        episodes = successes = 0
        returns: list[float] = []
        lo, hi = self.env.action_low, self.env.action_high
        for i in range(min(self.e, actions_NHA.shape[1])):
            a = torch.where(ended[:, None], torch.zeros_like(actions_NHA[:, i]), actions_NHA[:, i])
            res = self.env.step(torch.maximum(torch.minimum(a, hi), lo))
            live = ~ended
            reward += live.float() * (self.gamma ** i) * res.reward
            self.ep_return += live.float() * res.reward
            new = res.done & live
            episodes += int(new.sum())
            successes += int((res.success & new).sum())
            returns += self.ep_return[new].tolist()
            self.ep_return[new] = 0.0
            ended |= res.done
            self.obs = res.obs
        return reward, ended, episodes, successes, returns

    def collect(self, rollout, decisions: int) -> Segment:
        import ray

        t0 = time.time()
        obs, chains, logps, versions, rewards, dones = [], [], [], [], [], []
        episodes = successes = 0
        returns: list[float] = []
        for _ in range(decisions):
            out = ray.get(rollout.act.remote(self.obs))
            obs.append(self.obs)
            r, d, e, s, rets = self._execute(out["actions"])
            chains.append(out["chain"])
            logps.append(out["logp"])
            versions.append(out["version"])
            rewards.append(r)
            dones.append(d)
            episodes, successes, returns = episodes + e, successes + s, returns + rets
        n = self.env.num_envs
        return Segment(self.index, obs, self.obs, torch.stack(chains), torch.stack(logps), torch.tensor(versions),
                       torch.stack(rewards), torch.stack(dones), decisions * self.e * n, episodes, successes,
                       t0, time.time(), returns)

    def close(self) -> None:
        self.env.close()


class RolloutWorker:
    def __init__(self, model_dir: str | dict[str, bytes], rl: dict, device: str, seed: int):
        torch.manual_seed(seed)
        self.mp, self.policy = _policy(model_dir, device, rl)
        self.policy.eval()
        self.version = 0
        self.g = torch.Generator(device=self.mp.device).manual_seed(seed)

    def pid(self) -> int:
        return os.getpid()

    def host(self) -> str:
        import socket

        return socket.gethostname()

    def set_weights(self, state: dict, version: int) -> int:
        self.policy.load_state_dict(state)
        self.version = version
        return version

    def act(self, obs: Obs) -> dict:
        chain, logp, _ = self.policy.sample(self.mp.batch(obs), generator=self.g)
        return {"chain": chain.cpu(), "logp": logp.cpu(), "actions": self.mp.unnormalise(chain[:, -1]),
                "version": self.version}


class Learner:
    def __init__(self, model_dir: str | dict[str, bytes], rl: dict, device: str, seed: int,
                 threads: int | None = None):
        torch.manual_seed(seed)
        if threads:
            torch.set_num_threads(threads)
        self.rl = rl
        self.mp, self.policy = _policy(model_dir, device, rl)
        head = [p for n, p in self.policy.named_parameters() if n.startswith("value_head") or n == "log_std"]
        body = [p for n, p in self.policy.named_parameters()
                if p.requires_grad and not (n.startswith("value_head") or n == "log_std")]
        self.body, self.head = body, head
        self.opt = torch.optim.Adam([{"params": body, "lr": rl["lr"]}, {"params": head, "lr": rl["value_lr"]}])
        self.version = 0
        self.g = torch.Generator().manual_seed(seed)

    def pid(self) -> int:
        return os.getpid()

    def host(self) -> str:
        import socket

        return socket.gethostname()

    def weights(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}

    def vla_weights(self) -> dict:
        return {k: v.detach().cpu().contiguous() for k, v in self.policy.vla.state_dict().items()}

    def state(self) -> dict:
        return {"policy": self.weights(), "optimizer": self.opt.state_dict(), "version": self.version}

    def load_state(self, state: dict) -> int:
        self.policy.load_state_dict(state["policy"])
        self.opt.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        return self.version

    def _values(self, obs: Obs, chunk: int = 512) -> torch.Tensor:
        n = obs.state.shape[0]
        return torch.cat([self.policy.value(self.mp.batch(take(obs, torch.arange(i, min(i + chunk, n)))))
                          for i in range(0, n, chunk)]).cpu()

    def anneal(self, done_fraction: float) -> float:
        """Set the noise's std cap for `done_fraction` of the budget (`final_std`); takes effect with the next
        broadcast, so the segments collected afterwards are scored by the cap they were drawn with."""
        rl = self.rl
        if rl.get("final_std") is not None:
            f = min(max(done_fraction, 0.0), 1.0)
            self.policy.set_std_cap(math.exp((1 - f) * math.log(rl["init_std"]) + f * math.log(rl["final_std"])))
        return float(self.policy.stds().detach().exp().mean())

    def update(self, segments: list[Segment], critic_only: bool = False) -> dict:
        from roboloop.rl.objective import gae, ppo_loss

        rl, t0 = self.rl, time.time()
        gamma_dec = rl["gamma"] ** rl["execute_steps"]
        obs_all, chains, behav, advs, rets, stale = [], [], [], [], [], []
        for s in segments:
            t, n = s.reward.shape
            flat = cat_obs(s.obs + [s.last_obs])
            v = self._values(flat).view(t + 1, n)
            adv, ret = gae(s.reward * rl["reward_scale"], v[:t], s.done, v[t], gamma_dec, rl["gae_lambda"])
            obs_all += s.obs
            chains.append(s.chain.flatten(0, 1))
            behav.append(s.logp.flatten())
            advs.append(adv.flatten())
            rets.append(ret.flatten())
            stale.append(int(self.version - s.version.min()))
        obs = cat_obs(obs_all)
        chain, logp_b = torch.cat(chains), torch.cat(behav)
        adv, ret = torch.cat(advs), torch.cat(rets)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        m = chain.shape[0]
        dev = self.mp.device
        with torch.no_grad():
            logp_prox = torch.cat([self.policy.evaluate(self.mp.batch(take(obs, idx)), chain[idx].to(dev))[0].cpu()
                                   for idx in torch.arange(m).split(rl["minibatch"])])
        stats: dict[str, list[float]] = {"policy": [], "value": [], "kl": [], "clip": []}
        stopped = False
        for _ in range(rl["epochs"]):
            for idx in torch.randperm(m, generator=self.g).split(rl["minibatch"]):
                lp, ent, val = self.policy.evaluate(self.mp.batch(take(obs, idx)), chain[idx].to(dev))
                terms = ppo_loss(lp, logp_prox[idx].to(dev), logp_b[idx].to(dev), adv[idx].to(dev), val,
                                 ret[idx].to(dev), ent, rl["clip"], rl["is_cap"], rl["value_coef"], rl["entropy_coef"])
                loss = rl["value_coef"] * terms.value if critic_only else terms.loss
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                # clipped apart: the critic's gradients (large while it learns the returns) must not shrink the
                # policy's through a shared global norm
                torch.nn.utils.clip_grad_norm_(self.body, rl["grad_clip"])
                torch.nn.utils.clip_grad_norm_(self.head, rl["grad_clip"])
                self.opt.step()
                for k, x in (("policy", terms.policy), ("value", terms.value), ("kl", terms.approx_kl),
                             ("clip", terms.clip_fraction)):
                    stats[k].append(float(x.detach()))
                if not critic_only and float(terms.approx_kl) > rl["target_kl"]:
                    stopped = True
                    break
            if stopped:
                break
        self.version += 1
        mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
        return {"version": self.version, "decisions": m, "policy_loss": mean(stats["policy"]),
                "value_loss": mean(stats["value"]), "approx_kl": mean(stats["kl"]),
                "clip_fraction": mean(stats["clip"]), "kl_stop": stopped, "critic_only": critic_only,
                "staleness_max": max(stale), "noise_std": float(self.policy.stds().detach().exp().mean()),
                "learn_s": round(time.time() - t0, 3)}
