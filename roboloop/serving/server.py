"""`roboloop serve`: the policy server (websocket + msgpack, one process, asyncio).

The event loop only decodes, validates and replies; forward passes run on one worker thread, so a slow
model never blocks the loop (a problem users of other policy servers report). Requests that arrive while
a forward pass runs, or within `max_wait_ms` of the first one while other acting sessions have not asked yet
(`Batcher`), are batched into the next pass (grouped by camera shapes); `max_batch=1` turns batching off.
Authentication happens in the HTTP upgrade (a bearer token compared in constant time); a bad message gets an
error reply and the connection stays open; a message over the size limit closes that connection (1009) and
nobody else's.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from roboloop.policies.obs import Obs
from roboloop.serving import wire
from roboloop.serving.follow import Follower, own_cache, resolve
from roboloop.serving.service import ModelSlot, PolicyService, respond, signature

log = logging.getLogger("roboloop.serve")


@dataclass
class ServeConfig:
    ref: str  # a model folder or registry:[URI#]NAME@REF (an alias is followed)
    host: str = "127.0.0.1"
    port: int = 8765  # 0: any free port (`Server.port` says which)
    device: str = "cpu"
    seed: int = 0
    max_batch: int = 64  # rows (observations) in one forward pass; 1: no batching
    # how long the first request of a batch waits for company from other sessions that are acting (a request in the
    # last second), and only while one of them has none in the batch: one robot never waits; 0: no wait (requests
    # that arrive during a forward pass still share the next one)
    max_wait_ms: float = 5.0
    max_message_bytes: int = wire.MAX_MESSAGE_BYTES
    follow_interval_s: float = 2.0
    follow_retry_s: float = 60.0  # a refused version is tried again after this long (0: at every look)
    # torch threads for forward passes, set by `roboloop serve` for its process (0: this machine's cores less one,
    # left to the event loop, the (de)coding and a local client)
    threads: int = 0
    cache: str = ".roboloop/serve-cache"
    # what forward passes run in: fp32, or bf16 autocast where the device multiplies bf16 natively (refused elsewhere)
    precision: str = "fp32"
    # resource limits (docs: "Serving limits"). Connections past `max_connections` (all holders of the token) are
    # refused at the handshake (HTTP 503); a connection that sends nothing for `idle_timeout_s` is closed (1001);
    # one that does not take a reply within `send_timeout_s` (a client that sends but never reads) is dropped, and
    # at most `max_queue` received messages wait per connection, so one costs at most (max_queue + 1) messages.
    max_connections: int = 64
    idle_timeout_s: float = 300.0
    send_timeout_s: float = 10.0
    max_queue: int = 2


ACTIVE_S = 1.0  # a session is acting when its last request came this recently


class Batcher:
    """Requests into forward passes. After a pass, clients that were answered together ask again a few ms apart
    (measured on 2 cores, LeRobot's ACT at 96x128, 8 clients back to back: with no wait a pass took 6.2 of the 8
    requests on average, the rest waited for the next one; with up to 2 ms for the others 6.0-6.8, with 5 ms 8.0).
    So the first request of a batch waits, up to `max_wait_ms`, for the sessions that are acting and are not in the
    batch yet, and only for those whose next request is due within the wait by their own cadence (the mean of their
    last intervals): it stops as soon as they are all in, and never waits for a session that is alone, idle or
    slower (a lone fast robot lost 42% of its chunks/s while a 2 Hz client was also connected)."""

    def __init__(self, service: PolicyService, max_batch: int, max_wait_ms: float):
        self.service, self.max_batch, self.max_wait = service, max(1, max_batch), max(0.0, max_wait_ms) / 1e3
        self.queue: asyncio.Queue = asyncio.Queue()
        self.passes = 0
        self.last_seen: dict[int, float] = {}  # session -> when its last request came
        self.period: dict[int, float] = {}  # session -> its recent interval between requests (s)

    def due(self, within: float) -> set[int]:
        """Sessions that are acting and whose next request is expected within `within` s (one with no cadence yet
        is expected)."""
        now = time.perf_counter()
        return {s for s, t in self.last_seen.items()
                if now - t < ACTIVE_S and (s not in self.period or t + self.period[s] - now <= within)}

    def closed(self, session: int) -> None:
        self.last_seen.pop(session, None)
        self.period.pop(session, None)

    async def submit(self, obs: Obs, slot: ModelSlot | None = None, session: int = 0) -> tuple[Any, str, float, int]:
        now, last = time.perf_counter(), self.last_seen.get(session)
        if last is not None:
            p = self.period.get(session)
            self.period[session] = now - last if p is None else 0.5 * p + 0.5 * (now - last)
        self.last_seen[session] = now
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((obs, fut, session, slot))
        return await fut

    async def _collect(self) -> list[tuple[Obs, asyncio.Future, int, ModelSlot | None]]:
        items = [await self.queue.get()]
        rows = items[0][0].state.shape[0]
        deadline = time.perf_counter() + self.max_wait
        while rows < self.max_batch:
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - time.perf_counter()
                if left <= 0 or not self.due(left) - {it[2] for it in items}:  # nobody due is missing
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), left)
                except TimeoutError:
                    break
            items.append(item)
            rows += item[0].state.shape[0]
        return items

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            items = await self._collect()
            groups: dict[tuple, list[tuple[Obs, asyncio.Future, int, ModelSlot | None]]] = {}
            for it in items:  # one pass per version and camera shapes
                groups.setdefault((id(it[3]), signature(it[0])), []).append(it)
            for group in groups.values():
                try:
                    chunks, version, ms = await loop.run_in_executor(self.service.compute, self.service.act,
                                                                     [it[0] for it in group], group[0][3])
                    self.passes += 1
                    for it, c in zip(group, chunks, strict=True):
                        if not it[1].done():
                            it[1].set_result((c, version, ms, len(group)))
                except Exception as e:  # a failing forward pass fails its requests, not the server
                    log.exception("forward pass failed")
                    for it in group:
                        if not it[1].done():
                            it[1].set_exception(e)


class Server:
    """The running server (in a background thread with `start()`, or in the foreground with `serve_forever()`)."""

    def __init__(self, cfg: ServeConfig, token: str):
        self.cfg, self._token = cfg, token
        self.cache, self._cache_lock = own_cache(Path(cfg.cache))  # this server's alone (its follower prunes it)
        folder, version, self.follow = resolve(cfg.ref, self.cache)
        self.service = PolicyService.load(folder, version, cfg.device, cfg.seed, cfg.precision)
        self.port = cfg.port
        self.requests = self.errors = self.connections = 0  # connections: sessions that passed the token check
        self.open_connections = 0
        self.dropped = 0  # connections closed by a limit (idle, not reading, too many)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.follower: Follower | None = None
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ connection handling
    def _auth(self, connection: Any, request: Any) -> Any:
        got = request.headers.get_all("Authorization")
        try:  # one header, compared as bytes: a duplicate or undecodable one is a refusal, not a server error
            ok = len(got) == 1 and hmac.compare_digest(got[0].encode("utf-8", "surrogateescape"),
                                                       f"Bearer {self._token}".encode())
        except (UnicodeError, TypeError):
            ok = False
        if not ok:
            self.errors += 1
            log.warning("refused a connection from %s: no valid token", connection.remote_address)
            return connection.respond(HTTPStatus.UNAUTHORIZED, "a valid token is required (Authorization: Bearer)\n")
        if self.open_connections >= self.cfg.max_connections:
            self.dropped += 1
            log.warning("refused a connection from %s: %d connections open (max_connections)",
                        connection.remote_address, self.open_connections)
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE,
                                      f"the server holds its limit of {self.cfg.max_connections} connections\n")
        return None

    def _handler(self, batcher: Batcher) -> Callable:
        from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK

        async def handle(ws: Any) -> None:
            self.connections += 1
            self.open_connections += 1
            session = self.connections
            iface = self.service.open_session()  # the version's interface it is served for as long as it is open
            submit = functools.partial(batcher.submit, session=session)
            try:
                while True:
                    try:
                        data = await asyncio.wait_for(ws.recv(), self.cfg.idle_timeout_s)
                    except TimeoutError:
                        why = self._drop(ws, f"sent nothing for {self.cfg.idle_timeout_s:g} s (idle_timeout_s)")
                        await ws.close(1001, why)
                        return
                    self.requests += 1
                    reply, ok = await respond(self.service, data, submit, self.cfg.max_message_bytes, iface)
                    self.errors += not ok
                    try:
                        await asyncio.wait_for(ws.send(reply), self.cfg.send_timeout_s)
                    except TimeoutError:  # closed at once: what it holds in buffers is freed now, not after
                        self._drop(ws, f"took no reply for {self.cfg.send_timeout_s:g} s (send_timeout_s)")
                        ws.transport.abort()  # a closing handshake it would never answer
                        return
            except ConnectionClosedOK:
                pass
            except ConnectionClosedError as e:  # a client that died or lost its network: one line, not a traceback
                log.info("%s went away without closing (%s)", ws.remote_address, e)
            finally:
                self.open_connections -= 1
                self.service.close_session(iface)
                batcher.closed(session)
        return handle

    def _drop(self, ws: Any, why: str) -> str:
        self.dropped += 1
        log.warning("closed the connection of %s: it %s", ws.remote_address, why)
        return why[:120]

    async def _main(self) -> None:
        from websockets.asyncio.server import serve

        batcher = Batcher(self.service, self.cfg.max_batch, self.cfg.max_wait_ms)
        self.batcher = batcher
        task = asyncio.create_task(batcher.run())
        self._stop = asyncio.Event()
        async with serve(self._handler(batcher), self.cfg.host, self.cfg.port, process_request=self._auth,
                         max_size=self.cfg.max_message_bytes, max_queue=max(1, self.cfg.max_queue), compression=None,
                         ping_interval=20) as srv:
            self.port = srv.sockets[0].getsockname()[1]
            self._ready.set()
            log.warning("serving %s on ws://%s:%d", self.service.slot.version, self.cfg.host, self.port)
            await self._stop.wait()
        task.cancel()
        self.service.compute.shutdown(wait=False)

    def _start_follower(self) -> None:
        if self.follow is not None:
            uri, name, alias = self.follow
            self.follower = Follower(self.service, uri, name, alias, self.cache, self.cfg.follow_interval_s,
                                     self.cfg.follow_retry_s)
            self.follower.seen = int(self.service.slot.version.split("@v")[1].split("+")[0])
            self.follower.start()

    def serve_forever(self) -> None:
        self._start_follower()
        asyncio.run(self._run_forever())

    async def _run_forever(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._main()

    def start(self, timeout: float = 30.0) -> Server:
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run_forever()), daemon=True,
                                       name="roboloop-serve")
        self.thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the policy server did not start within {timeout:.0f} s")
        self._start_follower()
        return self

    def stop(self) -> None:
        if self.follower is not None:
            self.follower.stop_event.set()
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self.thread is not None:
            self.thread.join(10)
        self._cache_lock.close()  # the download cache is free for the next server

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
