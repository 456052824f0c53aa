"""The policy server's wire format: msgpack maps, numpy arrays as explicit (dtype, shape, bytes) triples.

Why msgpack and not pickle (LeRobot's async inference `pickle.loads` whatever reaches its port): decoding
a msgpack message builds only dicts, lists, strings, numbers and bytes; no class is looked up and no code
runs. Arrays are rebuilt with `np.frombuffer` from a dtype on a short allow-list, after the byte count
was checked against the shape. Every limit (message size, array size, nesting, string length) is
checked before anything is allocated from a number the sender chose.

Messages (one websocket binary frame each; the client's token travels in the HTTP upgrade's
`Authorization: Bearer` header, never in a message):

    request  {"type": "act", "id": int, "timestamp": float,
              "state": (N, S) float32, "images": {camera: (N, H, W, 3) uint8}, "instructions": [str] * N,
              "env_state": (N, E) float32  # only for a model that reads observation.environment_state
              "past": [{"state": ..., "images": ...}, ...]  # optional: earlier frames, oldest first
              "keys": [[episode, step]] * N  # optional (an evaluation): each row's noise is drawn from them}
    request  {"type": "info", "id": int}
    reply    {"type": "chunk", "id", "timestamp" (echoed), "actions": (N, H, A) float32, "version": str,
              "infer_ms": float, "batch": int (requests in that forward pass), "note": str (optional)}
    reply    {"type": "info", "id", "model": {...}}   |   {"type": "error", "id", "error": str}
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

# what the server decodes; anything else is refused before allocation
DTYPES = {"uint8", "float32", "float64", "float16", "int32", "int64", "bool"}
# 32 MiB: 36 frames of 480x640x3 (921,600 bytes each), e.g. 16 envs with two such cameras or 36 robots with one;
# a larger batch raises `roboloop serve --max-message-mb` (and the client's max_size) or sends fewer rows a request
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
RAY_PROXY_MAX_BYTES = 16 * 1024 * 1024  # Ray Serve's proxy (uvicorn's ws_max_size) closes larger messages abruptly
MAX_DIMS = 6
ND = "__nd__"
# containers (maps, lists) and their items in one message: a real request (64 past frames of a few cameras) has
# a few hundred. Without a budget, 16 MB of empty msgpack lists (one byte each) decoded into 16 million Python
# lists: +2.25 GB and 37.6 s on the server's event loop. Counted as they are decoded, so decoding stops early.
MAX_CONTAINERS = 4096
MAX_ITEMS = 65536


class WireError(ValueError):
    """A message that cannot be decoded or does not have the expected shape; its text is sent back."""


def pack_array(a: np.ndarray) -> dict[str, Any]:
    """The array's bytes go to msgpack as a view, not a copy: a 480x640 frame's `tobytes()` beside the packed
    message made two ~1 MB buffers per call, and freeing both let glibc hand the pages back, so the next call
    faulted them in again (measured on 2 cores: 1.7 ms per frame to encode, 0.04 ms with the view)."""
    a = np.asarray(a, order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    if a.dtype.name not in DTYPES:
        raise WireError(f"dtype {a.dtype} is not sent over the wire (use one of {sorted(DTYPES)})")
    return {ND: True, "dtype": a.dtype.name, "shape": list(a.shape), "data": memoryview(a.reshape(-1).view(np.uint8))}


def _to_wire(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return pack_array(x)
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # a torch tensor
        return pack_array(x.detach().cpu().numpy())
    if isinstance(x, dict):
        return {k: _to_wire(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_wire(v) for v in x]
    return x


def dumps(msg: dict[str, Any]) -> bytes:
    return msgpack.packb(_to_wire(msg), use_bin_type=True)


def unpack_array(d: dict[str, Any], what: str) -> np.ndarray:
    dtype, shape, data = d.get("dtype"), d.get("shape"), d.get("data")
    if dtype not in DTYPES:
        raise WireError(f"{what}: dtype {dtype!r} is not accepted (one of {sorted(DTYPES)})")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or \
            not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 for n in shape):
        raise WireError(f"{what}: shape {shape!r} is not a list of at most {MAX_DIMS} non-negative ints")
    if not isinstance(data, bytes):
        raise WireError(f"{what}: data is {type(data).__name__}, not bytes")
    expect = math.prod(shape) * np.dtype(dtype).itemsize  # Python ints: a product of six 2**31 never wraps
    if expect != len(data):
        raise WireError(f"{what}: {len(data)} bytes for shape {shape} {dtype} (expects {expect})")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _from_wire(x: Any, what: str, depth: int = 0) -> Any:
    if depth > 8:
        raise WireError(f"{what}: nested deeper than 8 levels")
    if isinstance(x, dict):
        if x.get(ND) is True:
            return unpack_array(x, what)
        return {k: _from_wire(v, f"{what}.{k}", depth + 1) for k, v in x.items()}
    if isinstance(x, list):
        return [_from_wire(v, f"{what}[{i}]", depth + 1) for i, v in enumerate(x)]
    return x


def loads(data: bytes | str, max_bytes: int = MAX_MESSAGE_BYTES) -> dict[str, Any]:
    """One message, or `WireError` naming what is wrong with it."""
    if isinstance(data, str):
        raise WireError("text frame: messages are msgpack in binary frames")
    if len(data) > max_bytes:
        raise WireError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    budget = _Budget()
    try:
        # strict_map_key: only str/bytes keys; no ext_hook: an ExtType stays inert and is refused below
        msg = msgpack.unpackb(data, raw=False, strict_map_key=True, list_hook=budget.list, object_hook=budget.map,
                              max_str_len=1 << 20, max_bin_len=max_bytes, max_array_len=MAX_ITEMS,
                              max_map_len=1 << 12, max_ext_len=0)
    except WireError:
        raise
    except Exception as e:  # msgpack raises several unrelated types for truncated or malformed input
        raise WireError(f"not a msgpack message ({type(e).__name__}: {e})") from None
    if not isinstance(msg, dict):
        raise WireError(f"a message is a map, got {type(msg).__name__}")
    if not isinstance(msg.get("type"), str):
        raise WireError("a message needs a string field 'type'")
    rid, ts = msg.get("id"), msg.get("timestamp")
    if rid is not None and (not isinstance(rid, int) or isinstance(rid, bool) or not -2**63 <= rid < 2**63):
        raise WireError(f"id: expected an integer, got {type(rid).__name__}")  # replies echo it: nothing large
    if ts is not None and (not isinstance(ts, (int, float)) or isinstance(ts, bool)):
        raise WireError(f"timestamp: expected a number, got {type(ts).__name__}")
    return _from_wire(msg, "message")


class _Budget:
    """Counts the containers and items msgpack builds while it decodes, and stops it past the limits."""

    def __init__(self) -> None:
        self.containers = self.items = 0

    def _count(self, n: int) -> None:
        self.containers += 1
        self.items += n
        if self.containers > MAX_CONTAINERS or self.items > MAX_ITEMS:
            raise WireError(f"a message holds more than {MAX_CONTAINERS} maps and lists or {MAX_ITEMS} items in "
                            "them; send arrays as arrays")

    def list(self, x: list) -> list:
        self._count(len(x))
        return x

    def map(self, x: dict) -> dict:
        self._count(len(x))
        return x
