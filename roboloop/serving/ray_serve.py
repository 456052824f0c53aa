"""`roboloop serve --engine ray`: the same policy server as a Ray Serve application, for more than one replica or
machine (KubeRay's RayService on a cluster: infra/k8s/rayservice-policy.yaml).

A FastAPI ingress takes the websocket (Serve's proxy carries it to a replica); each replica holds a
`PolicyService` (load, check, follow the registry alias, swap between forward passes) and batches with
`@serve.batch` (up to `max_batch` requests or `max_wait_ms`). Messages are answered by the same `respond` as
the single-process server, so the wire format, limits and errors are identical. The token is read by each
replica from the token file (on a cluster: a Kubernetes Secret mounted at that path), never passed as an
argument that Ray would record.
"""

import asyncio
import hmac
import logging
from typing import Any

# at module level and without `from __future__ import annotations`: FastAPI resolves the endpoint's `WebSocket`
# annotation from this module's globals (a string it cannot resolve makes `ws` a query parameter: HTTP 403)
from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from roboloop.serving.server import ServeConfig

log = logging.getLogger("roboloop.serve")


def _make_service(cfg: ServeConfig) -> Any:
    """A replica's checked PolicyService, following the registry alias when the reference names one."""
    from pathlib import Path

    from roboloop.serving.follow import Follower, own_cache, resolve
    from roboloop.serving.service import PolicyService

    cache, lock = own_cache(Path(cfg.cache))  # each replica's own on a machine (its follower prunes it)
    folder, version, follow = resolve(cfg.ref, cache)
    service = PolicyService.load(folder, version, cfg.device, cfg.seed, cfg.precision)
    service.cache_lock = lock  # held for the replica's life
    if follow is not None:
        f = Follower(service, follow[0], follow[1], follow[2], cache, cfg.follow_interval_s,
                     cfg.follow_retry_s)
        f.seen = int(version.split("@v")[1])
        f.start()
    return service


async def _forward(service: Any, batch: list[tuple[Any, Any]]) -> list[tuple]:
    """`@serve.batch`'s (observation, slot) requests in forward passes of one version and equal camera shapes, off
    the replica's event loop."""
    from roboloop.serving.service import signature

    groups: dict[tuple, list[int]] = {}
    for i, (obs, slot) in enumerate(batch):
        groups.setdefault((id(slot), signature(obs)), []).append(i)
    out: list[Any] = [None] * len(batch)
    for idx in groups.values():
        chunks, version, ms = await asyncio.get_running_loop().run_in_executor(
            service.compute, service.act, [batch[i][0] for i in idx], batch[idx[0]][1])
        for i, c in zip(idx, chunks, strict=True):
            out[i] = (c, version, ms, len(idx))
    return out


class _Sessions:
    """A replica's open connections, against the process engine's limits (ServeConfig.max_connections,
    idle_timeout_s, send_timeout_s): without them, 256 idle authenticated connections (Serve's
    max_ongoing_requests) locked every honest client out of the replica."""

    def __init__(self, cfg: ServeConfig):
        self.cfg, self.open = cfg, 0


async def _session(ws: WebSocket, token: str, service: Any, submit: Any, sessions: _Sessions) -> None:
    from roboloop.serving.service import respond

    cfg = sessions.cfg
    if not hmac.compare_digest(ws.headers.get("authorization", "").encode(), f"Bearer {token}".encode()):
        await ws.close(code=1008)  # before accept: the handshake is refused (HTTP 403)
        return
    if sessions.open >= cfg.max_connections:  # refused at the handshake, as the process engine refuses (there 503)
        log.warning("refused a connection: %d open (max_connections)", sessions.open)
        await ws.close(code=1013)
        return
    await ws.accept()
    sessions.open += 1
    iface = service.open_session()

    async def submit_one(obs: Any, slot: Any) -> tuple:
        return await submit((obs, slot))

    try:
        while True:
            try:
                m = await asyncio.wait_for(ws.receive(), cfg.idle_timeout_s)
            except TimeoutError:  # nothing sent for idle_timeout_s: its place goes to someone else
                await ws.close(code=1001)
                return
            if m["type"] == "websocket.disconnect":
                return
            data = m["bytes"] if m.get("bytes") is not None else (m.get("text") or "")
            reply, _ = await respond(service, data, submit_one, cfg.max_message_bytes, iface)
            try:
                await asyncio.wait_for(ws.send_bytes(reply), cfg.send_timeout_s)
            except TimeoutError:  # a client that sends but does not read
                return
    except WebSocketDisconnect:
        return
    finally:
        sessions.open -= 1
        service.close_session(iface)


def build_app(cfg: ServeConfig, token_file: str, replicas: int = 1, per_node: int | None = None) -> Any:
    from ray import serve

    app = FastAPI()

    # a replica that stops answering its health check (its machine lost) leaves the routing table within ~8 s,
    # not Serve's default ~40 s: new robot sessions stop landing on it (tests/cluster/test_ray_hosts.py)
    # each websocket is one ongoing request for its whole life: room for max_connections of them and the handshakes
    # that are refused beyond
    @serve.deployment(num_replicas=replicas, max_ongoing_requests=cfg.max_connections + 32,
                      ray_actor_options={"num_cpus": 0},
                      health_check_period_s=2, health_check_timeout_s=6)
    @serve.ingress(app)
    class RoboloopPolicy:
        def __init__(self, cfg: ServeConfig, token_file: str):
            import os

            import torch

            from roboloop.serving.token import read_token

            # Ray starts workers with OMP_NUM_THREADS=1; a replica gets this machine's cores shared among replicas
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // replicas))
            self.cfg, self._token, self.service = cfg, read_token(token_file), _make_service(cfg)
            self.sessions = _Sessions(cfg)
            self.act_batched.set_max_batch_size(max(1, cfg.max_batch))  # type: ignore[attr-defined]
            self.act_batched.set_batch_wait_timeout_s(max(0.0, cfg.max_wait_ms) / 1e3)  # type: ignore[attr-defined]

        @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.0)
        async def act_batched(self, batch: list[Any]) -> list[tuple]:
            return await _forward(self.service, batch)

        @app.websocket("/")
        async def websocket(self, ws: WebSocket) -> None:
            await _session(ws, self._token, self.service, self.act_batched, self.sessions)

    deployment: Any = RoboloopPolicy
    if per_node is not None:  # Ray Serve's own placement rule: at most `per_node` replicas on one machine
        deployment = deployment.options(max_replicas_per_node=per_node)
    return deployment.bind(cfg, token_file)


def app(args: dict[str, Any]) -> Any:
    """Ray Serve application builder (`import_path: roboloop.serving.ray_serve:app` in a RayService or `serve run`):
    `args` are ServeConfig fields (`ref` required) plus `replicas`; the token file is `token_file` or
    $ROBOLOOP_SERVE_TOKEN_FILE (a mounted Secret), read by each replica."""
    import dataclasses

    from roboloop.serving.token import token_path

    fields = {f.name for f in dataclasses.fields(ServeConfig)}
    unknown = sorted(set(args) - fields - {"replicas", "replicas_per_node", "token_file"})
    if unknown or "ref" not in args:
        raise ValueError(f"roboloop policy app: args need 'ref'; unknown {unknown} (known: {sorted(fields)}, "
                         "replicas, token_file)")
    cfg = ServeConfig(**{k: v for k, v in args.items() if k in fields})
    from roboloop.serving.wire import RAY_PROXY_MAX_BYTES

    if "max_message_bytes" not in args:
        cfg.max_message_bytes = RAY_PROXY_MAX_BYTES
    elif cfg.max_message_bytes > RAY_PROXY_MAX_BYTES:
        raise ValueError(f"max_message_bytes {cfg.max_message_bytes}: Ray Serve's proxy closes websocket messages "
                         f"over {RAY_PROXY_MAX_BYTES} bytes")
    per_node = args.get("replicas_per_node")
    return build_app(cfg, str(token_path(args.get("token_file"))), int(args.get("replicas", 1)),
                     int(per_node) if per_node is not None else None)


def run(cfg: ServeConfig, token_file: str, replicas: int = 1, address: str | None = None,
        per_node: int | None = None) -> int:
    """Start (or join `address`'s) Ray, deploy the app on cfg.host:cfg.port; returns the port."""
    import ray
    from ray import serve

    from roboloop.procs import own_sigterm

    if not ray.is_initialized():
        with own_sigterm():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(include_dashboard=False, log_to_driver=False, num_cpus=max(2, replicas))
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    serve.run(build_app(cfg, token_file, replicas, per_node), name="roboloop-policy", route_prefix="/")
    return cfg.port


def shutdown() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()
