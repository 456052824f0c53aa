"""Acting in bf16: any family's policy under torch's bf16 autocast, where the hardware multiplies bf16 natively.

Measured on this project's 2-core AVX512-BF16 EPYC (LeRobot's ACT at its default size, one 96x128 camera):
under autocast a chunk took about 0.6x the fp32 time at one observation and 0.5x at eight, and its actions
differed from fp32's by at most 0.015 where they reach 2 (bench/serve.py --precision bf16 gives the served
numbers). The default stays fp32 (served chunks equal the in-process and LeRobot's own), so bf16 is asked for,
and refused where it would run slower than fp32 (a CPU without AMX or AVX512-BF16: oneDNN then emulates bf16
with conversions).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from roboloop.availability import MissingCapability

PRECISIONS = ("fp32", "bf16")


def require_acting_precision(precision: str, device: str) -> str:
    """What runs `precision` natively on `device` (e.g. "AVX512-BF16"), or a MissingCapability saying why not."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return "fp32"
    if device.startswith("cuda"):
        if not torch.cuda.is_available() or not torch.cuda.is_bf16_supported():
            raise MissingCapability(f"precision bf16 on {device}: this GPU does not run bf16 (compute capability "
                                    "8.0 or newer does)")
        return "bf16 (CUDA)"
    from roboloop.availability import cpu_bf16

    native = cpu_bf16()
    if native is None:
        raise MissingCapability("precision bf16 on this CPU: it has neither AMX nor AVX512-BF16, so bf16 would be "
                                "emulated and slower than fp32; act in fp32")
    return f"bf16 ({native})"


@contextmanager
def noise_kept(policy: Any) -> Iterator[None]:
    """Calls that must not consume the policy's noise stream (a check, a timing): served chunks stay the ones the
    same model gives in-process. Its own generator (roboloop's VLA) and torch's global one (what LeRobot's
    Diffusion samples its noise from)."""
    g = getattr(policy, "g", None)
    saved = g.get_state() if isinstance(g, torch.Generator) else None
    global_state = torch.get_rng_state()
    try:
        yield
    finally:
        if isinstance(g, torch.Generator) and saved is not None:
            g.set_state(saved)
        torch.set_rng_state(global_state)


# the modules whose weights autocast casts to bf16 for every call (linear, convolutions, attention's projections)
_CAST = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d,
         torch.nn.ConvTranspose2d, torch.nn.MultiheadAttention)


def cast_weights(policy: Any) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """Casts, in place, the weights autocast would cast to bf16 on every call; returns each with its fp32
    original (`uncast` puts them back). A cast is deterministic, so the chunks are autocast's, without re-casting
    every weight for each chunk (about 0.75x the time per chunk for ACT at 96x128 on 2 cores), unless the model
    reads its parameters' dtype: LeRobot's Diffusion draws its noise in the dtype of its first parameter."""
    cast = []
    for net in (v for v in vars(policy).values() if isinstance(v, torch.nn.Module)):
        for mod in net.modules():
            if isinstance(mod, _CAST):
                for p in mod.parameters(recurse=False):
                    if p.dtype == torch.float32:
                        cast.append((p, p.data))
                        p.data = p.data.to(torch.bfloat16)
    return cast


def uncast(cast: list[tuple[torch.nn.Parameter, torch.Tensor]]) -> None:
    for p, original in cast:
        p.data = original


class AutocastPolicy:
    """`policy` acting under bf16 autocast; every other attribute is the policy's. Chunks come back as fp32.
    `weights_cast`: its linear and convolution weights were cast once (`cast_weights`), so it no longer acts in
    fp32 on its own."""

    def __init__(self, policy: Any, device: str):
        self.policy = policy
        self._device_type = "cuda" if str(device).startswith("cuda") else "cpu"
        self.weights_cast = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["policy"], name)

    def act(self, obs: Any) -> torch.Tensor:
        with torch.autocast(self._device_type, dtype=torch.bfloat16):
            out = self.policy.act(obs)
        return out.float()


def probe_obs(policy: Any) -> Any:
    """One observation any policy can act on: the dataset's mean state (zeros without stats), grey frames."""
    import numpy as np

    from roboloop.policies.obs import Obs

    mean = (policy.stats.get(policy.state_key) or {}).get("mean") if isinstance(policy.stats, dict) else None
    state = torch.zeros(1, policy.state_dim)
    if mean is not None and np.asarray(mean).size == policy.state_dim:
        state = torch.as_tensor(np.asarray(mean, dtype=np.float32)).reshape(1, -1)
    h, w = policy.image_size if policy.image_size else (64, 64)
    images = {k: torch.full((1, h, w, 3), 128, dtype=torch.uint8) for k in policy.camera_keys}
    env, dim = None, int(getattr(policy, "env_state_dim", 0))  # the scene's state, for a policy that reads it
    if dim:
        env_mean = (policy.stats.get("observation.environment_state") or {}).get("mean")
        env = torch.as_tensor(np.asarray(env_mean, dtype=np.float32)).reshape(1, dim) if env_mean is not None \
            else torch.zeros(1, dim)
    return Obs(state, images, [getattr(policy, "instruction", "")], env)  # an export: its own instruction only


def acting(policy: Any, precision: str, device: str, probe: Any = None) -> Any:
    """`policy` as it acts at `precision` (the caller checked it with `require_acting_precision` before loading).
    In bf16 its weights are cast once where that gives autocast's chunk on `probe` (default `probe_obs`) exactly;
    else every call casts them."""
    if precision == "fp32":
        return policy
    probe = probe_obs(policy) if probe is None else probe
    out = AutocastPolicy(policy, device)
    with noise_kept(policy):
        every_call = out.act(probe)
    cast = cast_weights(policy)
    with noise_kept(policy):
        once = out.act(probe)
    if torch.equal(every_call, once):
        out.weights_cast = len(cast)
    else:
        uncast(cast)
    return out
