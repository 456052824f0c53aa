"""What the policy server does, whatever carries its messages: hold a checked model, turn decoded requests into
observations, batch them into one forward pass, and follow a registry alias.

A `ModelSlot` is a loaded policy that passed its check (it produces a finite (N, H, A) chunk on a probe
observation: the last request it served, or the dataset's mean state and grey frames before any). The
service swaps slots by one reference assignment between forward passes, so a reply is never produced
by a half-loaded model nor by two; the version that produced a chunk is in its reply.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roboloop.hashing import file_sha256
from roboloop.policies.obs import Obs
from roboloop.policies.precision import AutocastPolicy, acting, noise_kept, probe_obs, require_acting_precision
from roboloop.serving import wire
from roboloop.serving.wire import WireError

log = logging.getLogger("roboloop.serve")
MAX_ROWS = 256  # observations in one request
MAX_SIDE = 4096  # pixels on a camera frame's side


def compute_thread() -> ThreadPoolExecutor:
    """The one thread a server runs the serving model's torch work on: its load, its check, the thread count
    choice and every forward pass. libgomp (PyTorch's OpenMP) gives each thread that starts a parallel region a
    team of workers of its own, and once a process holds more OpenMP threads than it has cores, the workers stop
    spinning between regions (100 spins) and wait in the kernel to be woken for every one. Measured on 2 cores
    (LeRobot's ACT, one 96x128 camera, requests alternating with in-process calls): loaded on the main thread and
    run on another, the server's forward took 39 ms p50 against 30 ms in the bench's process."""
    return ThreadPoolExecutor(1, thread_name_prefix="roboloop-serve-forward")


def on_passing_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` on a thread that ends when it returns, so that the OpenMP team its torch work starts ends
    with it (a swap's load and check, beside the serving model's thread; see `compute_thread`)."""
    with ThreadPoolExecutor(1, thread_name_prefix="roboloop-serve-load") as pool:
        return pool.submit(fn, *args).result()


@dataclass
class ModelSlot:
    policy: Any
    version: str  # "NAME@vN" for a registry version, else the folder's name; + the weights' sha256 prefix
    folder: Path
    sha256: str
    precision: str = "fp32"  # "fp32", or "bf16 (AVX512-BF16)" etc.: what the forward passes run in
    # bf16: the largest |bf16 - fp32| action on the check observation, and that chunk's largest |action|
    deviation: tuple[float, float] | None = None
    camera_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)  # (H, W) each camera was recorded at
    check_chunk: Any = None  # its chunk on the check observation (a new version's actions against the serving one's)

    def interface(self) -> tuple:
        """What a client relies on: the inputs it sends and the chunk it gets. Versions with equal interfaces can
        replace one another under a connected client; others are served to new connections only."""
        p = self.policy
        return (int(p.state_dim), tuple(p.camera_keys), int(getattr(p, "history", 1)),
                int(getattr(p, "env_state_dim", 0)), int(p.action_dim), int(p.horizon))

    def spec(self) -> dict[str, Any]:
        p = self.policy
        runtime = type(p.policy if isinstance(p, AutocastPolicy) else p).__name__
        return {"version": self.version, "sha256": self.sha256, "runtime": runtime, "precision": self.precision,
                "state_key": p.state_key, "state_dim": int(p.state_dim), "action_dim": int(p.action_dim),
                "horizon": int(p.horizon), "camera_keys": list(p.camera_keys),
                "image_size": list(p.image_size) if p.image_size else None,
                "history": int(getattr(p, "history", 1)), "env_state_dim": int(getattr(p, "env_state_dim", 0)),
                "bf16_deviation": list(self.deviation) if self.deviation is not None else None,
                "camera_sizes": {k: list(v) for k, v in self.camera_sizes.items()}}


def load_slot(folder: Path, version: str, device: str = "cpu", seed: int = 0,
              probe: Obs | None = None, precision: str = "fp32") -> ModelSlot:
    """Load `folder` and check it; raises (naming the version) when it does not load or does not act. In bf16
    the check chunk is also computed in fp32 and the largest difference kept (`ModelSlot.deviation`). Under a memory
    bound from its weights' size (`procs.load_budget`): a config.json with large dimensions took 5.2 GB to be
    refused, in the server itself at start."""
    from roboloop.policies import WEIGHTS_FILE
    from roboloop.procs import load_budget, memory_bound
    from roboloop.serving.export import ONNX_FILE

    weights = Path(folder) / (ONNX_FILE if (Path(folder) / ONNX_FILE).is_file() else WEIGHTS_FILE)
    size = weights.stat().st_size if weights.is_file() else 0
    budget = load_budget(size)
    with memory_bound(budget, f"loading {version} ({size / 2**20:.0f} MiB of weights)"):
        return _load_and_check(folder, version, device, seed, probe, precision)


def _load_and_check(folder: Path, version: str, device: str, seed: int, probe: Obs | None,
                    precision: str) -> ModelSlot:
    from roboloop.policies import WEIGHTS_FILE, load_policy
    from roboloop.serving.export import ONNX_FILE, open_export

    if (Path(folder) / ONNX_FILE).is_file():  # an export: onnxruntime runs it
        if precision != "fp32":
            raise ValueError(f"{folder}: an ONNX export runs on onnxruntime as exported (fp32); serve the model "
                             f"folder for {precision}")
        sha = file_sha256(Path(folder) / ONNX_FILE)
        policy: Any = open_export(folder, seed)
        ran = "fp32"
    else:
        ran = require_acting_precision(precision, device)
        sha = file_sha256(Path(folder) / WEIGHTS_FILE)
        policy = load_policy(folder, device, seed=seed)
    slot = ModelSlot(policy, f"{version}+{sha[:8]}", Path(folder), sha, ran, camera_sizes=recorded_sizes(folder))
    obs = probe if probe is not None and _fits(slot, probe) else probe_obs(policy)
    ref = None
    if precision != "fp32":  # the fp32 chunk first: acting in bf16 casts the weights
        with noise_kept(policy):
            ref = policy.act(obs).detach().float().cpu()
        slot.policy = acting(policy, precision, device, obs)
    out = slot.check_chunk = check(slot, obs)
    if ref is not None:
        slot.deviation = (float((out - ref).abs().max()), float(ref.abs().max()))
    return slot


def recorded_sizes(folder: Path) -> dict[str, tuple[int, int]]:
    """The (H, W) each camera of the model's training data had, where its folder records them (roboloop's policy.json);
    a folder that does not say (lerobot-train's) gives none."""
    from roboloop.policies import model_info

    try:
        cams = model_info(folder).cameras
    except (OSError, ValueError, TypeError):
        return {}
    return {c["key"]: (int(c["shape"][0]), int(c["shape"][1])) for c in cams
            if isinstance(c, dict) and isinstance(c.get("key"), str) and len(c.get("shape") or []) == 2}


def check_frame_size(slot: ModelSlot, key: str, h: int, w: int, what: str) -> None:
    """A camera frame the model can be fed without inventing or distorting what it sees: the aspect its training
    camera had (within 2%) and at least the model's input size. Where the recording's size is unknown, frames
    under a quarter of the input size are refused (a 1x1 frame resized is no image). Before, any size was
    resized silently (1x1 and 3000x3000 to a 480x640 model)."""
    size = getattr(slot.policy, "image_size", None)
    mh, mw = (int(size[0]), int(size[1])) if size else (1, 1)
    want = slot.camera_sizes.get(key)
    if want is None:
        if 4 * h < mh or 4 * w < mw:
            raise WireError(f"{what}images[{key!r}]: {h}x{w} frames for a model that reads {mh}x{mw}")
        return
    aspect = (w / h) / (want[1] / want[0])
    if abs(aspect - 1) > 0.02 or h < min(mh, want[0]) or w < min(mw, want[1]):
        raise WireError(f"{what}images[{key!r}]: {h}x{w} frames; the model was trained on {want[0]}x{want[1]} "
                        f"(any size of that aspect from {min(mh, want[0])}x{min(mw, want[1])} up): check the camera")


def check(slot: ModelSlot, obs: Obs) -> torch.Tensor:
    """The slot's chunk on `obs` (its noise stream kept), or ValueError when it has the wrong shape or is not
    finite."""
    p = slot.policy
    with noise_kept(p):
        out = p.act(obs).detach().float().cpu()
    n = obs.state.shape[0]
    want = (n, int(p.horizon), int(p.action_dim))
    if tuple(out.shape) != want:
        raise ValueError(f"{slot.version}: the check chunk has shape {tuple(out.shape)}, expected {want}")
    if not torch.isfinite(out).all():
        raise ValueError(f"{slot.version}: the check chunk is not finite")
    return out


def _fits(slot: ModelSlot, obs: Obs) -> bool:
    dim = int(getattr(slot.policy, "env_state_dim", 0))
    return obs.state.shape[-1] == slot.policy.state_dim and set(slot.policy.camera_keys) <= set(obs.images) \
        and (not dim or obs.env_state is not None and obs.env_state.shape[-1] == dim)


def _env_state(msg: dict[str, Any], dim: int, rows: int, what: str) -> torch.Tensor | None:
    """The frame's observation.environment_state, where the model reads it (else ignored)."""
    if not dim:
        return None
    env = msg.get("env_state")
    if not isinstance(env, np.ndarray) or env.shape != (rows, dim) or env.dtype.kind != "f" \
            or not np.isfinite(env).all():
        raise WireError(f"{what}env_state: the model reads observation.environment_state: expected finite "
                        f"({rows}, {dim}) floats, got {getattr(env, 'shape', type(env).__name__)}")
    return torch.from_numpy(env.astype(np.float32))


def _frame(msg: dict[str, Any], slot: ModelSlot, what: str, n: int | None) -> tuple[torch.Tensor, dict]:
    p = slot.policy
    state = msg.get("state")
    if not isinstance(state, np.ndarray) or state.ndim != 2 or state.shape[1] != p.state_dim:
        shape = getattr(state, "shape", type(state).__name__)
        raise WireError(f"{what}state: expected an (N, {p.state_dim}) array, got {shape}")
    if state.dtype.kind != "f" or not np.isfinite(state).all():
        raise WireError(f"{what}state: expected finite floats ({state.dtype})")
    rows = state.shape[0]
    if not 1 <= rows <= MAX_ROWS or (n is not None and rows != n):
        raise WireError(f"{what}state: {rows} rows (expected {n if n is not None else f'1..{MAX_ROWS}'})")
    images = msg.get("images") or {}
    if not isinstance(images, dict):
        raise WireError(f"{what}images: expected a map of camera name to array")
    out = {}
    for key in p.camera_keys:
        im = images.get(key)
        if im is None:
            raise WireError(f"{what}images: camera {key!r} missing (the model reads {list(p.camera_keys)})")
        if not isinstance(im, np.ndarray) or im.dtype != np.uint8 or im.ndim != 4 or im.shape[0] != rows \
                or im.shape[3] != 3 or not (0 < im.shape[1] <= MAX_SIDE and 0 < im.shape[2] <= MAX_SIDE):
            raise WireError(f"{what}images[{key!r}]: expected ({rows}, H, W, 3) uint8, got "
                            f"{getattr(im, 'shape', type(im).__name__)} {getattr(im, 'dtype', '')}")
        check_frame_size(slot, key, int(im.shape[1]), int(im.shape[2]), what)
        out[key] = torch.from_numpy(im.copy())
    return torch.from_numpy(state.astype(np.float32)), out


def to_obs(msg: dict[str, Any], slot: ModelSlot) -> Obs:
    """A decoded `act` request as an observation the slot's policy can act on, or `WireError` naming the field."""
    state, images = _frame(msg, slot, "", None)
    n = state.shape[0]
    dim = int(getattr(slot.policy, "env_state_dim", 0))
    instr = msg.get("instructions", [""] * n)
    if isinstance(instr, str):
        instr = [instr] * n
    if not isinstance(instr, list) or len(instr) != n or not all(isinstance(s, str) and len(s) <= 4096
                                                                 for s in instr):
        raise WireError(f"instructions: expected {n} strings of at most 4096 characters")
    past_msg = msg.get("past")
    past = None
    if past_msg is not None:
        if not isinstance(past_msg, list) or len(past_msg) > 64:
            raise WireError("past: expected a list of at most 64 earlier frames")
        past = []
        for i, fr in enumerate(past_msg):
            if not isinstance(fr, dict):
                raise WireError(f"past[{i}]: expected a map")
            s, im = _frame(fr, slot, f"past[{i}].", n)
            past.append(Obs(s, im, instr, _env_state(fr, dim, n, f"past[{i}].")))
    return Obs(state, images, instr, _env_state(msg, dim, n, ""), past=past, keys=_keys(msg.get("keys"), n))


def _keys(keys: Any, n: int) -> torch.Tensor | None:
    """An evaluation's (episode, step) per row, which a sampling model draws its noise from (numbers only)."""
    if keys is None:
        return None
    if not isinstance(keys, list) or len(keys) != n or not all(
            isinstance(k, list) and len(k) == 2 and all(isinstance(v, int) and 0 <= v < 2**40 for v in k)
            for k in keys):
        raise WireError(f"keys: expected {n} pairs of non-negative integers (episode, step)")
    return torch.tensor(keys, dtype=torch.int64)


def signature(obs: Obs) -> tuple:
    """Requests with equal signatures can share one forward pass."""
    return (tuple((k, tuple(v.shape[1:])) for k, v in sorted(obs.images.items())),
            None if obs.past is None else len(obs.past), obs.keys is None)


def concat(batch: list[Obs]) -> Obs:
    if len(batch) == 1:
        return batch[0]
    past = None
    if batch[0].past is not None:
        past = [concat([o.past[j] for o in batch]) for j in range(len(batch[0].past))]  # type: ignore[index]
    return Obs(torch.cat([o.state for o in batch]), {k: torch.cat([o.images[k] for o in batch])
                                                     for k in batch[0].images},
               [s for o in batch for s in o.instructions],
               None if batch[0].env_state is None else torch.cat([o.env_state for o in batch]),  # type: ignore[misc]
               past=past, keys=None if batch[0].keys is None else torch.cat([o.keys for o in batch]))  # type: ignore[misc]


class NonFiniteChunk(WireError):
    """The model's chunk for a request is not finite: it is not sent (a robot must never get NaN targets)."""


@dataclass
class PolicyService:
    """The server's state: the newest checked slot of each interface that connected sessions use, what it refused
    (surfaced in replies and the log), and the probe a new version is checked on."""

    slot: ModelSlot  # the newest version: what a new session gets
    device: str = "cpu"
    seed: int = 0
    precision: str = "fp32"  # what every version it loads acts in ("fp32" or "bf16")
    refused: str = ""  # the last version that failed its check, and why (no server paths: clients read it)
    probe: Obs | None = None  # the last request whose chunk was finite (a NaN-making one never becomes the probe)
    cache_lock: Any = None  # the lock on this server's own download cache (follow.own_cache), held for its life
    lock: threading.Lock = field(default_factory=threading.Lock)  # one forward pass at a time; swaps between
    # slot, lanes and sessions: held only to read or change them, never during a pass (the event loop takes it)
    state_lock: threading.Lock = field(default_factory=threading.Lock)
    compute: ThreadPoolExecutor = field(default_factory=compute_thread)  # where forward passes run (`compute_thread`)
    # interface -> the newest slot with it, kept while sessions that connected to it are open
    lanes: dict[tuple, ModelSlot] = field(default_factory=dict)
    sessions: dict[tuple, int] = field(default_factory=dict)  # interface -> open sessions that use it
    follow_note: str = ""  # the followed alias's state when it is not what it should be (deleted, say)

    def __post_init__(self) -> None:
        self.lanes.setdefault(self.slot.interface(), self.slot)

    @classmethod
    def load(cls, folder: Path, version: str, device: str = "cpu", seed: int = 0,
             precision: str = "fp32") -> PolicyService:
        """A service whose model is loaded and checked on the thread its forward passes will run on."""
        compute = compute_thread()
        slot = compute.submit(load_slot, folder, version, device, seed, None, precision).result()
        return cls(slot, device, seed, precision, compute=compute)

    # ------------------------------------------------------------------ sessions
    def open_session(self) -> tuple:
        """A new connection: it is served the newest version's interface for as long as it stays open."""
        with self.state_lock:
            iface = self.slot.interface()
            self.sessions[iface] = self.sessions.get(iface, 0) + 1
            return iface

    def close_session(self, iface: tuple) -> None:
        with self.state_lock:
            self.sessions[iface] = self.sessions.get(iface, 1) - 1
            if self.sessions[iface] <= 0:
                del self.sessions[iface]
                if iface != self.slot.interface():  # nobody uses that interface any more: free its model
                    self.lanes.pop(iface, None)

    def slot_for(self, iface: tuple | None) -> ModelSlot:
        """The newest slot a session with interface `iface` may be served by (None: the newest)."""
        with self.state_lock:
            return self.slot if iface is None else self.lanes.get(iface, self.slot)

    # ------------------------------------------------------------------ forward passes
    def act(self, batch: list[Obs], slot: ModelSlot | None = None) -> tuple[list[torch.Tensor], str, float]:
        """One forward pass for requests of equal signature, by `slot` (default the newest): their chunks, the
        version, inference ms. It runs in torch's inference mode, which skips the autograd bookkeeping `no_grad`
        still does (version counters, view tracking): the demo's VLA, ~2,800 small ops a pass, acted 10% faster
        on 2 cores (5.10 -> 4.59 ms p50). A request whose chunk is not finite gets `NonFiniteChunk` in its place."""
        obs = concat(batch)
        with self.lock:
            slot = slot or self.slot
            t0 = time.perf_counter()
            with torch.inference_mode():  # nothing a server computes is ever differentiated (see `act`'s doc)
                out = slot.policy.act(obs).detach().float().cpu()
            ms = (time.perf_counter() - t0) * 1e3
        if out.ndim == 2:
            out = out[:, None]
        sizes = [o.state.shape[0] for o in batch]
        chunks: list[Any] = list(torch.split(out, sizes))
        for i, c in enumerate(chunks):
            if not torch.isfinite(c).all():
                chunks[i] = NonFiniteChunk(f"{slot.version} gave a non-finite chunk for this observation (a state "
                                           "far outside what it was trained on?): not sent")
            elif slot is self.slot:
                self.probe = batch[i]
        return chunks, slot.version, ms

    # ------------------------------------------------------------------ new versions
    def swap_to(self, folder: Path, version: str) -> bool:
        """Load and check `folder` beside the serving model, then swap: sessions whose interface it keeps move to it
        between two forward passes; sessions connected to another interface (a new action size or chunk length,
        other inputs) keep their version until they close, and new sessions get the new one. On failure keep
        serving the old one."""
        from roboloop.serving.action_range import refusal

        try:
            new = on_passing_thread(load_slot, folder, version, self.device, self.seed, self.probe,
                                    self.precision)
            if why := refusal(self.slot, new):
                raise ValueError(why)
        except Exception as e:  # any failure of the new version keeps the old one serving
            self.refused = redact(f"{version} refused: {type(e).__name__}: {e}")[:500]
            log.error("keeping %s: %s: %s", self.slot.version, version, e)
            return False
        with self.lock, self.state_lock:  # between two passes
            old, iface = self.slot, new.interface()
            self.slot, self.lanes[iface], self.refused = new, new, ""
            if old.interface() != iface and not self.sessions.get(old.interface()):
                self.lanes.pop(old.interface(), None)
        if old.interface() != iface:
            log.warning("now serving %s to new connections (was %s: %s, kept for the %d connected to it)",
                        new.version, old.version, describe_change(old, new), self.sessions.get(old.interface(), 0))
        else:
            log.warning("now serving %s (was %s)", new.version, old.version)
        return True

    def note_for(self, iface: tuple | None) -> str:
        """What a session's replies say beside the chunk: a refused version, or a newer one it is not served."""
        notes = [n for n in (self.refused, self.follow_note) if n]
        current = self.slot
        if iface is not None and iface != current.interface():
            change = describe_change(self.lanes.get(iface, current), current)
            notes.append(f"{current.version} is served to new connections only ({change}): reconnect to use it")
        return "; ".join(notes)


def describe_interface(spec: dict[str, Any]) -> tuple:
    """A server's `info` model spec as `ModelSlot.interface` gives it."""
    return (int(spec["state_dim"]), tuple(spec["camera_keys"]), int(spec.get("history", 1)),
            int(spec.get("env_state_dim", 0)), int(spec["action_dim"]), int(spec["horizon"]))


def describe_change(old: ModelSlot, new: ModelSlot) -> str:
    o, n = old.interface(), new.interface()
    names = ("state size", "cameras", "history", "scene-state size", "action size", "chunk length")
    return ", ".join(f"{k} {a} -> {b}" for k, a, b in zip(names, o, n, strict=True) if a != b) or "the same interface"


def redact(text: str) -> str:
    """`text` with absolute paths cut to their last part: replies go to clients, who need not learn the server's
    folders (the log keeps the whole text)."""
    import re

    return re.sub(r"(?<![\w.])/(?:[^\s'\":,)]+/)+([^\s'\":,)]*)", r".../\1", text)


async def respond(service: PolicyService, data: bytes | str, submit: Callable[..., Awaitable[tuple]],
                  max_bytes: int, session: tuple | None = None) -> tuple[bytes, bool]:
    """One request's reply (encoded) and whether it was served; whatever carries the messages (the single-process
    server, a Ray Serve replica) calls this. `session`: the interface the connection was opened on
    (`PolicyService.open_session`). `submit(obs, slot)` returns (chunk or an exception, version, infer ms,
    batch size)."""
    rid = None
    try:
        msg = wire.loads(data, max_bytes)
        rid = msg.get("id")
        kind = msg["type"]
        slot = service.slot_for(session)
        if kind == "info":
            info = {"type": "info", "id": rid, "model": slot.spec(), "refused": service.refused,
                    "note": service.note_for(session), "max_message_bytes": max_bytes}
            return wire.dumps(info), True
        if kind != "act":
            raise WireError(f"unknown message type {kind!r} (act or info)")
        chunk, version, ms, n = await submit(to_obs(msg, slot), slot)
        if isinstance(chunk, Exception):
            raise chunk
        out = {"type": "chunk", "id": rid, "timestamp": msg.get("timestamp"), "actions": chunk.numpy(),
               "version": version, "infer_ms": ms, "batch": n}
        note = service.note_for(session)
        if note:
            out["note"] = note
        return wire.dumps(out), True
    except WireError as e:
        return wire.dumps({"type": "error", "id": rid, "error": str(e)}), False
    except Exception as e:  # the server keeps serving; the client learns what happened
        log.exception("request failed")
        why = redact(f"internal error: {type(e).__name__}: {e}")[:500]
        return wire.dumps({"type": "error", "id": rid, "error": why}), False
