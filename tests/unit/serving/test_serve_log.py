"""`roboloop serve` says where it listens in one write, and the serve check reads the port only from a whole line.

Found in an SO-101 serve check: `print` wrote "listening on ws://127.0.0.1:35021" and its newline separately; the
server's thread logged its first line between the two, and the check read port 350212026 (the port's digits and
the log's date)."""

from __future__ import annotations

import io
import re
import sys

from roboloop.cli.serve import _say
from roboloop.serving.check import LISTENING


class _Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, s: str) -> int:
        self.calls.append(s)
        return super().write(s)


def test_a_line_is_one_write(monkeypatch):
    out = _Writes()
    monkeypatch.setattr(sys, "stderr", out)
    _say("roboloop serve: listening on ws://127.0.0.1:35021")
    assert out.calls == ["roboloop serve: listening on ws://127.0.0.1:35021\n"]


def test_the_port_is_read_only_from_a_whole_line():
    assert int(LISTENING.search("roboloop serve: listening on ws://127.0.0.1:35021").group(1)) == 35021
    glued = "roboloop serve: listening on ws://127.0.0.1:350212026-12-03 14:26:34,176 WARNING roboloop.serve: serving"
    assert LISTENING.search(glued) is None
    assert re.search(r"\d{6,}", glued)  # what the old pattern took for a port
