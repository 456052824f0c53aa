"""What the training process's C allocator does with freed memory (`TrainRecipe.host_memory`).

glibc's malloc gives every block above its mmap threshold (32 MB at most) its own mapping and unmaps it on
free, so a CPU step's activations (the SO-101 preset's keypoint maps: 50 MB each, a few dozen a step) are
faulted in page by page again on every step, each page zeroed by the kernel: ~200,000 page faults a step there,
a quarter of the step's wall clock on two cores. "keep" turns that path off and raises the trim threshold, so a
freed block stays in the heap and the next step reuses it (the process's RSS stays at its peak instead of
returning between steps). Same arithmetic, same results; only where the bytes come from changes.

The policy server's clients apply it too (`PolicyClient(host_memory=)`): each request carries ~1 MB per 480x640
frame, copied a few times on its way out (encoding, websocket framing and masking), and with glibc's defaults a
client that does nothing else returned those buffers and faulted them in again on every request. (The server's
process is left at glibc's defaults: its model's larger freed blocks already make glibc keep frame-sized ones.)
"""

from __future__ import annotations

import ctypes
import platform
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)
TRIM_AT = 1 << 30  # free memory at the heap's top returned to the system only above 1 GiB


def apply(mode: str, device_type: str, auto_keeps: bool | None = None) -> str:
    """Set the allocator for this process as `mode` asks (auto: keep when training on the CPU, or as `auto_keeps`
    says where the caller knows better); returns what it did, for the run record (never silent: where glibc is
    not there to keep memory, it says so)."""
    if mode not in ("auto", "keep", "system"):
        raise ValueError(f"host_memory {mode!r}: one of auto, keep, system")
    keeps = device_type == "cpu" if auto_keeps is None else auto_keeps
    if mode == "system" or (mode == "auto" and not keeps):
        return f"system (host_memory {mode}{', not a CPU run' if mode == 'auto' and auto_keeps is None else ''})"
    libc_name = platform.libc_ver()[0]
    if not sys.platform.startswith("linux") or libc_name != "glibc":
        return f"system (host_memory {mode}: the C library here is {libc_name or sys.platform}, not glibc)"
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_MMAP_MAX, 0) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_AT) != 1:
        return f"system (host_memory {mode}: glibc's mallopt refused)"
    return "keep (glibc keeps freed blocks for reuse: no mmap per block, trimmed above 1 GiB)"
