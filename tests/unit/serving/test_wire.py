"""The wire format: round trips, and every malformed message is a WireError naming the defect (never another
exception, never an allocation sized by the sender before its bytes are counted)."""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path

import msgpack
import numpy as np
import pytest

from roboloop.serving import wire


def test_arrays_and_fields_round_trip():
    msg = {"type": "act", "id": 3, "state": np.arange(12, dtype=np.float32).reshape(2, 6),
           "images": {"cam": np.full((2, 4, 5, 3), 7, np.uint8)}, "instructions": ["a", "b"], "timestamp": 1.5}
    back = wire.loads(wire.dumps(msg))
    assert back["id"] == 3 and back["instructions"] == ["a", "b"] and back["timestamp"] == 1.5
    assert back["state"].dtype == np.float32 and np.array_equal(back["state"], msg["state"])
    assert back["images"]["cam"].shape == (2, 4, 5, 3) and back["images"]["cam"].dtype == np.uint8


@pytest.mark.parametrize("a", [np.array(2.5, np.float32), np.zeros((0, 3), np.float32), np.array([[1, 0]], bool),
                               np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2], np.float16([1.5, -2]),
                               np.arange(24, dtype=np.uint8).reshape(2, 3, 4).transpose(2, 0, 1)])
def test_any_shape_and_layout_round_trips(a):
    """0-d, empty, strided and transposed arrays come back with their shape, dtype and values (the bytes are sent
    from a view of the array, in C order)."""
    back = wire.loads(wire.dumps({"type": "x", "a": a}))["a"]
    assert back.dtype == a.dtype and back.shape == a.shape and np.array_equal(back, a)


@pytest.mark.parametrize("bad, defect", [
    (b"", "not a msgpack message"),
    (msgpack.packb([1, 2]), "a message is a map"),
    (msgpack.packb({"id": 1}), "needs a string field 'type'"),
    (msgpack.packb({"type": "act", "s": {"__nd__": True, "dtype": "object", "shape": [1], "data": b"x"}}),
     "dtype 'object' is not accepted"),
    (msgpack.packb({"type": "act", "s": {"__nd__": True, "dtype": "float32", "shape": [1 << 20, 1 << 20],
                                         "data": b"\0" * 8}}), "8 bytes for shape"),
    (msgpack.packb({"type": "act", "s": {"__nd__": True, "dtype": "uint8", "shape": [-1], "data": b""}}),
     "non-negative ints"),
    (msgpack.packb({"type": "act", "s": {"__nd__": True, "dtype": "uint8", "shape": [2], "data": "ab"}}),
     "data is str"),
    (msgpack.packb({"type": "act", "x": msgpack.ExtType(1, b"os.system")}), "not a msgpack message"),
    (msgpack.packb({1: 2, "type": "act"}), "not a msgpack message"),
    ("text", "text frame"),
])
def test_malformed_messages_name_their_defect(bad, defect):
    with pytest.raises(wire.WireError, match=defect):
        wire.loads(bad)


def test_truncated_oversized_and_random_bytes_are_wire_errors():
    good = wire.dumps({"type": "act", "state": np.zeros((1, 6), np.float32)})
    for cut in range(1, len(good)):
        with contextlib.suppress(wire.WireError):  # anything else fails the test
            wire.loads(good[:cut])
    with pytest.raises(wire.WireError, match="exceeds the limit"):
        wire.loads(b"\0" * 2000, max_bytes=1000)
    rng = np.random.default_rng(0)
    for i in range(500):
        blob = rng.integers(0, 256, int(rng.integers(1, 300)), dtype=np.uint8).tobytes()
        if i % 2:  # a valid map header, so the decoder goes deeper
            blob = b"\x82\xa4type\xa3act" + blob
        with contextlib.suppress(wire.WireError):
            wire.loads(blob)


def test_nothing_on_the_serving_path_can_execute_network_bytes():
    """No pickle (nor its relatives) is imported or called by roboloop's serving modules."""
    banned = {"pickle", "cPickle", "cloudpickle", "dill", "marshal", "shelve", "joblib"}
    root = Path(__file__).parents[3] / "roboloop"
    files = sorted((root / "serving").glob("*.py")) + [root / "cli" / "serve.py"]
    assert len(files) >= 5
    for f in files:
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names = {(node.module or "").split(".")[0]}
            elif isinstance(node, ast.Attribute) and node.attr in ("load", "loads") and \
                    isinstance(node.value, ast.Name) and node.value.id in ("torch", "pickle", "np", "numpy"):
                names = {f"{node.value.id}.{node.attr}"}
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("eval", "exec"):
                names = {node.func.id}
            else:
                continue
            assert not names & (banned | {"torch.load", "pickle.loads", "np.load", "numpy.load", "eval", "exec"}), \
                f"{f.name}:{node.lineno} uses {names}"


def test_amplifying_messages_stop_early_and_small():
    """16 MB of empty lists decoded into 16 million Python lists (+2.25 GB, 37.6 s on the event loop): decoding now
    stops at a container budget, in about the time it takes to read the first few thousand."""
    import time
    import tracemalloc

    head = b"\x82\xa4type\xa3act\xa1x\xdd" + (1 << 16).to_bytes(4, "big")  # {"type": "act", "x": [65536 items]}
    flat = head + b"\x90" * (1 << 16)  # empty lists
    many = head + (b"\xdc\x00\x10" + b"\x90" * 16) * (1 << 16)  # lists of 16 empty lists: 1.1 million lists
    deep = b"\x82\xa4type\xa3act\xa1x" + (b"\x91" * 4000) + b"\x90"  # nesting (msgpack's own stack limit)
    for blob, why in ((flat, "more than 4096 maps and lists"), (many, "more than 4096 maps and lists"),
                      (deep, "not a msgpack message")):
        tracemalloc.start()
        t0 = time.perf_counter()
        with pytest.raises(wire.WireError, match=why):
            wire.loads(blob)
        took, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 8 << 20 and took < 2.0, (len(blob), peak, took)


@pytest.mark.parametrize("field, value", [("id", "x" * 1000), ("id", [1] * 100), ("id", 1.5), ("id", 2**63),
                                          ("timestamp", "now"), ("timestamp", {"a": b"x"}), ("timestamp", True)])
def test_echoed_fields_must_be_numbers(field, value):
    """A reply echoes `id` and `timestamp`: a client that sent megabytes there was answered with them."""
    with pytest.raises(wire.WireError, match=field):
        wire.loads(msgpack.packb({"type": "info", field: value}))


def test_a_shape_whose_product_overflows_int64_is_refused():
    shape = [2**31 - 1] * 6
    with pytest.raises(wire.WireError, match="8 bytes for shape"):
        wire.loads(msgpack.packb({"type": "act", "s": {"__nd__": True, "dtype": "uint8", "shape": shape,
                                                       "data": b"\0" * 8}}))
