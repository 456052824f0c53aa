"""A TCP door in front of a real server, for store faults on loopback: it refuses connections until `open_after_s`,
then forwards every connection to the server, at most `rate` bytes per second upstream across all of them (a slow
store), or at full speed."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class Door:
    def __init__(self, target: str, open_after_s: float = 0.0, rate: float | None = None):
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.rate, self.next_free, self.lock = rate, 0.0, threading.Lock()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, args=(open_after_s,), daemon=True).start()

    def close(self) -> None:
        self.stop.set()

    def _serve(self, open_after_s: float) -> None:
        if self.stop.wait(open_after_s):
            return
        srv = socket.create_server(("127.0.0.1", self.port))
        srv.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            up = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(conn, up, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, conn, False), daemon=True).start()
        srv.close()

    def _wait_for(self, n: int) -> None:
        """Upstream bytes share one budget of `rate` per second."""
        if self.rate is None:
            return
        with self.lock:
            start = max(time.monotonic(), self.next_free)
            self.next_free = start + n / self.rate
        time.sleep(max(0.0, start - time.monotonic()))

    def _pipe(self, a: socket.socket, b: socket.socket, upstream: bool) -> None:
        try:
            while data := a.recv(16384):
                if upstream:
                    self._wait_for(len(data))
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
