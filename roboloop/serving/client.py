"""Clients of `roboloop serve`: `PolicyClient` (one websocket, blocking calls) and `RemotePolicy`, a Policy whose
`act` asks the server, so the Evaluator (`--policy serve://HOST:PORT`) and the robot loop drive a served model
exactly as they drive one in their own process.

    from roboloop.serving.client import PolicyClient
    with PolicyClient("serve://127.0.0.1:8765") as c:      # the token from $ROBOLOOP_SERVE_TOKEN_FILE
        reply = c.act(state=s_NS, images={"observation.images.front": im_NHW3}, instructions=["pick up the cube"])
        reply.actions   # (N, H, A) float32, in the robot's units
        reply.version, reply.infer_ms, reply.roundtrip_ms
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from roboloop.policies.obs import Obs
from roboloop.serving import wire


class ServerError(RuntimeError):
    """The server answered with an error (its text names the defect)."""


class ServerLostError(ServerError):
    """The connection to the server broke (killed, restarted, network lost) and was not re-established."""


class ProtocolError(ServerLostError):
    """A reply that breaks the protocol (not msgpack, a text frame, an over-long field, another request's id or
    observation time): the connection is closed, since what comes next on it cannot be trusted to answer the next
    request; a robot holds and reconnects as it does for a lost server."""


@dataclass
class Reply:
    actions: np.ndarray  # (N, H, A)
    version: str
    infer_ms: float
    roundtrip_ms: float
    batch: int
    note: str = ""
    timestamp: float = 0.0  # the observation's time (time.time() when it was sent), echoed by the server


def ws_url(url: str) -> str:
    for prefix in ("serve://", "ws://"):
        if url.startswith(prefix):
            return "ws://" + url[len(prefix):]
    if url.startswith("wss://"):
        return url
    return "ws://" + url


class PolicyClient:
    """`host_memory` (auto: keep): what glibc does with freed blocks in this process (`roboloop.training.hostmem`).
    Each request's frames are copied a few times on the way out (encoding, websocket framing and masking); with
    glibc's defaults, in a process that does nothing else (a robot loop), those ~1 MB buffers per 480x640 frame
    are returned to the system and faulted in again on every request. `bench/serve.py`'s `robot_client` row
    (ACT, one 480x640 camera, 2 cores): 644 page faults a request and 3.38 ms p50 of round trip beyond the
    server's forward pass with glibc's defaults, none and 2.22 ms kept. `self.host_memory` says what applied."""

    def __init__(self, url: str, token: str | None = None, token_file: str | None = None, timeout: float = 60.0,
                 max_size: int = wire.MAX_MESSAGE_BYTES, host_memory: str = "auto", reconnect: int = 0,
                 backoff_s: float = 0.5):
        """`reconnect`: when the connection breaks, try this many times to open a new one (waiting `backoff_s`,
        doubled each try, at most 8 s) and resend the request; the new connection must serve the same interface
        (chunk shape, inputs). 0: a broken connection raises ServerLostError at once."""
        from roboloop.serving.token import read_token
        from roboloop.training import hostmem

        self.host_memory = hostmem.apply(host_memory, "cpu", auto_keeps=True)
        self._token = token if token is not None else read_token(token_file)
        self.url, self.timeout, self.max_size = ws_url(url), timeout, max_size
        self.reconnect, self.backoff_s, self.reconnects = max(0, reconnect), backoff_s, 0
        self.ids = itertools.count(1)
        self.ws = self._connect()
        self.spec = self.info()  # what this connection is served: every chunk is checked against it

    def _connect(self) -> Any:
        from websockets.exceptions import ConnectionClosed, InvalidMessage
        from websockets.sync.client import connect

        try:
            return connect(self.url, additional_headers={"Authorization": f"Bearer {self._token}"},
                           max_size=self.max_size, compression=None, open_timeout=self.timeout)
        except (OSError, ConnectionClosed, InvalidMessage) as e:  # refused, unreachable, timed out; or the socket
            # closed during the handshake (a server that died as it accepted: no HTTP answer, no close frame)
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise ServerLostError(f"no policy server answers at {self.url} ({why})") from None

    def _reopen(self, why: str) -> None:
        """A new connection after a broken one, within the reconnect budget; ServerLostError when none opens."""
        from roboloop.serving.service import describe_interface

        wait = self.backoff_s
        for _ in range(self.reconnect):
            time.sleep(min(wait, 8.0))
            wait *= 2
            try:
                self.ws = self._connect()
                spec = self.request({"type": "info"}, retry=False)["model"]
            except ServerLostError:
                continue
            if describe_interface(spec) != describe_interface(self.spec):
                raise ServerError(f"{self.url} came back serving {spec['version']}, which reads or writes other "
                                  f"things than {self.spec['version']} did: not resuming")
            self.reconnects += 1
            return
        raise ServerLostError(f"the policy server at {self.url} went away ({why})" +
                              (f"; {self.reconnect} reconnect attempts failed" if self.reconnect else
                               ": is it running? (PolicyClient(reconnect=N) / --reconnect tries again)"))

    def _check(self, actions: Any, rows: int, version: str) -> np.ndarray:
        """A chunk as the connection promised it ((rows, horizon, action size), finite), or ServerError: a robot
        must never execute a chunk of another shape or a NaN target."""
        want = (rows, int(self.spec["horizon"]), int(self.spec["action_dim"]))
        if not isinstance(actions, np.ndarray) or tuple(actions.shape) != want:
            raise ServerError(f"{self.url} sent a chunk of shape {getattr(actions, 'shape', None)} from {version}; "
                              f"this connection was opened for {want} ({self.spec['version']}): reconnect")
        if actions.dtype != np.float32:  # the model's float: an int, bool or float64 chunk is not what it computes
            raise ServerError(f"{self.url} sent a {actions.dtype} chunk from {version}; chunks are float32: "
                              "not executed")
        if not np.isfinite(actions).all():
            raise ServerError(f"{self.url} sent a non-finite chunk from {version}: not executed")
        return actions

    def reopen(self, why: str = "lost") -> None:
        """A new connection now, within the reconnect budget (at least one try); ServerLostError when none opens."""
        budget, self.reconnect = self.reconnect, max(1, self.reconnect)
        try:
            self._reopen(why)
        finally:
            self.reconnect = budget

    def request(self, msg: dict[str, Any], retry: bool = True) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        msg = {"id": next(self.ids), **msg}
        data = wire.dumps(msg)
        limit = getattr(self, "server_max_bytes", 0)
        if limit and len(data) > limit:  # the server would close the connection (1009): say why instead
            raise ServerError(f"this request is {len(data) / 2**20:.1f} MiB and {self.url} takes at most "
                              f"{limit / 2**20:.1f} MiB a message: send fewer rows or smaller frames a request")
        try:
            self.ws.send(data)
            raw = self.ws.recv(timeout=self.timeout)
        except (ConnectionClosed, OSError) as e:  # OSError: TimeoutError too (no reply within `timeout`)
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if not retry:
                raise ServerLostError(f"the policy server at {self.url} went away ({why})") from None
            self._reopen(why)
            return self.request(msg, retry=False)
        try:
            reply = wire.loads(raw, self.max_size)
        except wire.WireError as e:
            self._poisoned(f"a malformed reply ({e})")
        if reply.get("id") != msg["id"]:  # a late, replayed or invented reply: what comes next is out of step too
            self._poisoned(f"reply {reply.get('id')} to request {msg['id']}")
        if reply.get("type") == "error":
            raise ServerError(str(reply.get("error"))[:500])
        if "timestamp" in msg and reply.get("timestamp") != msg["timestamp"]:
            self._poisoned(f"a reply for the observation of {reply.get('timestamp')!r}, not of this request's "
                           f"{msg['timestamp']!r} (stale or replayed)")
        return reply

    def _poisoned(self, why: str) -> None:
        """Close a connection that broke the protocol and raise ProtocolError: the next request opens a new one."""
        with contextlib.suppress(Exception):  # closing a connection already gone
            self.ws.close()
        raise ProtocolError(f"{self.url} broke the protocol: {why}; the connection is closed")

    def info(self) -> dict[str, Any]:
        reply = self.request({"type": "info"})
        self.server_max_bytes = int(reply.get("max_message_bytes") or 0)  # 0: a server that does not say
        return reply["model"]

    def act(self, state: np.ndarray, images: dict[str, np.ndarray] | None = None,
            instructions: list[str] | str | None = None, past: list[dict] | None = None,
            env_state: np.ndarray | None = None, retry: bool = True, keys: list[list[int]] | None = None) -> Reply:
        """`env_state`: observation.environment_state, for a model that reads it (`info()["env_state_dim"]`).
        `retry=False`: a broken connection raises ServerLostError at once, whatever the reconnect budget (a robot
        loop holds the arm while it reconnects, rather than wait inside a request)."""
        state = np.asarray(state, dtype=np.float32)
        if state.ndim == 1:  # one robot: a batch of one
            state, images = state[None], {k: np.asarray(v)[None] for k, v in (images or {}).items()}
            env_state = None if env_state is None else np.asarray(env_state)[None]
        msg: dict[str, Any] = {"type": "act", "timestamp": time.time(), "state": state, "images": images or {},
                               "instructions": instructions if instructions is not None else [""] * len(state)}
        if env_state is not None:
            msg["env_state"] = np.asarray(env_state, dtype=np.float32)
        if past is not None:
            msg["past"] = past
        if keys is not None:  # each row's (episode, step): the server draws its noise from them, as in-process
            msg["keys"] = keys
        t0 = time.perf_counter()
        r = self.request(msg, retry=retry)
        actions = self._check(r.get("actions"), len(state), str(r.get("version")))
        return Reply(actions, str(r.get("version")), float(r.get("infer_ms", 0.0)), (time.perf_counter() - t0) * 1e3,
                     int(r.get("batch", 1)), str(r.get("note", ""))[:1000], float(msg["timestamp"]))

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _frame(obs: Obs, keys: list[str], env_state: bool = False) -> dict[str, Any]:
    out = {"state": obs.state.detach().float().cpu().numpy(),
           "images": {k: obs.images[k].detach().cpu().numpy() for k in keys}}
    if env_state and obs.env_state is not None:  # else the server names what is missing
        out["env_state"] = obs.env_state.detach().float().cpu().numpy()
    return out


class RemotePolicy:
    """A Policy served by `roboloop serve`: what the server's model reads and outputs, asked once at connect."""

    def __init__(self, url: str, token: str | None = None, token_file: str | None = None):
        self.client = PolicyClient(url, token, token_file)
        spec = self.spec = self.client.spec
        self.name = f"serve:{spec['version']}"
        self.state_dim, self.action_dim, self.horizon = spec["state_dim"], spec["action_dim"], spec["horizon"]
        self.state_key, self.action_key = spec["state_key"], "action"
        self.camera_keys, self.history = list(spec["camera_keys"]), int(spec.get("history", 1))
        self.image_size = tuple(spec["image_size"]) if spec.get("image_size") else None
        self.env_state_dim = int(spec.get("env_state_dim", 0))  # the model reads the scene's state
        self.stats: dict = {}
        self.versions: Counter[str] = Counter()  # which version produced how many chunks
        self.infer_ms: list[float] = []
        self.roundtrip_ms: list[float] = []

    def act(self, obs: Obs) -> torch.Tensor:
        env = bool(self.env_state_dim)
        f = _frame(obs, self.camera_keys, env)
        past = [_frame(p, self.camera_keys, env) for p in obs.past] if obs.past is not None and self.history > 1 \
            else None
        keys = obs.keys.tolist() if obs.keys is not None else None
        r = self.client.act(f["state"], f["images"], list(obs.instructions) or None, past, f.get("env_state"),
                            keys=keys)
        self.versions[r.version] += 1
        self.infer_ms.append(r.infer_ms)
        self.roundtrip_ms.append(r.roundtrip_ms)
        return torch.from_numpy(np.array(r.actions))

    def served(self) -> dict[str, Any]:
        """For the evaluation report: which versions answered, and how long chunks took (ms)."""
        def pct(xs: list[float], q: float) -> float | None:
            return round(float(np.percentile(xs, q)), 3) if xs else None

        return {"url": self.client.url, "versions": dict(self.versions), "chunks": len(self.infer_ms),
                "host_memory": self.client.host_memory.split(" (")[0],
                "infer_ms_p50": pct(self.infer_ms, 50), "roundtrip_ms_p50": pct(self.roundtrip_ms, 50),
                "roundtrip_ms_p99": pct(self.roundtrip_ms, 99)}

    def close(self) -> None:
        self.client.close()
