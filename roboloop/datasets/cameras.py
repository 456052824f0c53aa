"""Every camera a LeRobot dataset stores, however it stores it.

LeRobot keeps a camera in one of three forms, and a policy must see all of them:

- `video`: frames in mp4 files (h264, AV1, HEVC), RGB.
- `image`: PNG/JPEG bytes in the data parquet's own column (PushT, LIBERO and many converted datasets),
  a struct `{bytes, path}` per row.
- depth maps: a camera of shape (H, W, 1) flagged `info.is_depth_map`. LeRobot 0.6.1 writes it as a
  12-bit video (HEVC, `gray12le`) of log-quantised depth and decodes it back to millimetres; stored
  as images they are 16-bit PNGs in `info.depth_unit` (mm or m).

`cameras(info)` lists them in feature order; `decode_*` return what LeRobot's loader returns
(RGB as uint8 HxWx3, depth as float32 HxWx1 millimetres), so the conformance suite compares
them frame for frame. `to_model_input` turns either into the (3, h, w) float image in [0, 1]
the model's image encoders take: depth is scaled by the range the model stored at training
(the dataset's depth min/max, in mm) and repeated on the three input channels, so a depth
camera gets image tokens of its own, like any camera.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

# LeRobot 0.6.1's depth quantisation defaults (lerobot/configs/video.py), used when info.json omits them.
DEPTH_QMAX = 4095
DEPTH_DEFAULTS = {"depth_min": 0.01, "depth_max": 10.0, "shift": 3.5, "use_log": True}
MM_PER_METRE = 1000.0


@dataclass(frozen=True)
class Camera:
    key: str
    storage: Literal["video", "image"]
    depth: bool
    height: int
    width: int
    # depth videos: LeRobot's quantisation (metres); depth images: the unit the PNG values are in
    depth_min: float = DEPTH_DEFAULTS["depth_min"]
    depth_max: float = DEPTH_DEFAULTS["depth_max"]
    shift: float = DEPTH_DEFAULTS["shift"]
    use_log: bool = True
    depth_unit: str = "mm"

    def describe(self) -> dict[str, Any]:
        """What a model folder records about the camera it was trained on."""
        return {"key": self.key, "storage": self.storage, "depth": self.depth, "shape": [self.height, self.width]}


def _is_depth(feature) -> bool:
    info = feature.info or {}
    legacy = feature.video_info
    return bool(info.get("is_depth_map") or info.get("video.is_depth_map") or legacy.get("video.is_depth_map"))


def cameras(info) -> list[Camera]:
    """The dataset's cameras (video and image features, depth flagged), in feature order."""
    out = []
    for key, f in info.features.items():
        if f.dtype not in ("video", "image"):
            continue
        shape = list(f.shape)
        names = [str(n).lower() for n in (f.names or [])] if isinstance(f.names, list) else []
        if len(shape) == 3 and names[:1] in (["channel"], ["channels"]):  # (C, H, W) as some writers store it
            shape = [shape[1], shape[2], shape[0]]
        h, w = (int(shape[0]), int(shape[1])) if len(shape) >= 2 else (0, 0)
        vi = {**(f.video_info or {}), **(f.info or {})}
        depth = _is_depth(f)
        out.append(Camera(
            key=key, storage="video" if f.dtype == "video" else "image", depth=depth, height=h, width=w,
            depth_min=float(vi.get("video.depth_min", DEPTH_DEFAULTS["depth_min"])),
            depth_max=float(vi.get("video.depth_max", DEPTH_DEFAULTS["depth_max"])),
            shift=float(vi.get("video.shift", DEPTH_DEFAULTS["shift"])),
            use_log=bool(vi.get("video.use_log", DEPTH_DEFAULTS["use_log"])),
            depth_unit=str(vi.get("depth_unit") or "mm")))
    return out


def dequantize(codes: np.ndarray, cam: Camera) -> np.ndarray:
    """12-bit depth codes -> float32 millimetres, the inverse of LeRobot's `quantize_depth` (same maths)."""
    if cam.use_log:
        lo, hi = math.log(cam.depth_min + cam.shift), math.log(cam.depth_max + cam.shift)
        m = np.exp(codes.astype(np.float32) * np.float32((hi - lo) / DEPTH_QMAX) + np.float32(lo)) - np.float32(
            cam.shift)
    else:
        m = codes.astype(np.float32) * np.float32((cam.depth_max - cam.depth_min) / DEPTH_QMAX) + np.float32(
            cam.depth_min)
    np.clip(m, cam.depth_min, cam.depth_max, out=m)
    return np.round(m * np.float32(MM_PER_METRE)).astype(np.float32)


def decode_video_frame(frame, cam: Camera, size: tuple[int, int] | None) -> np.ndarray:
    """One PyAV frame: RGB (H, W, 3) uint8, or depth (H, W, 1) float32 mm; resized to size=(H, W) if given."""
    h, w = size if size is not None else (frame.height, frame.width)
    if cam.depth:
        if (h, w) != (frame.height, frame.width):  # depth codes resized as codes: nearest, never blended
            frame = frame.reformat(width=w, height=h, interpolation="POINT")
        return dequantize(frame.to_ndarray(format="gray12le"), cam)[..., None]
    return frame.to_ndarray(format="rgb24", width=w, height=h)


def decode_image_cell(cell: dict | None, cam: Camera, root: Path, size: tuple[int, int] | None,
                      where: str) -> np.ndarray:
    """One parquet image cell ({bytes, path}) as LeRobot decodes it: PIL, RGB (or depth in mm)."""
    from PIL import Image

    from roboloop.errors import CorruptFileError

    if not cell or (cell.get("bytes") is None and not cell.get("path")):
        raise CorruptFileError(f"{where}: camera {cam.key} has an empty image cell")
    try:
        src = io.BytesIO(cell["bytes"]) if cell.get("bytes") is not None else root / str(cell["path"])
        with Image.open(src) as img:
            if cam.depth:
                arr = np.asarray(img).astype(np.float32)
                if arr.ndim == 3:
                    arr = arr[..., 0]
                if cam.depth_unit == "m":
                    arr = arr * np.float32(MM_PER_METRE)
                if size is not None and arr.shape != tuple(size):
                    arr = np.asarray(Image.fromarray(arr).resize((size[1], size[0]), Image.Resampling.NEAREST))
                return arr[..., None]
            rgb = img.convert("RGB")
            if size is not None and (rgb.height, rgb.width) != tuple(size):
                rgb = rgb.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            return np.asarray(rgb)
    except (OSError, ValueError, SyntaxError) as e:  # PIL's errors for truncated or garbled files
        raise CorruptFileError(f"{where}: camera {cam.key}: the stored image cannot be decoded ({e})") from e


def depth_range(stats: dict, key: str, cam: Camera) -> tuple[float, float]:
    """(lo, hi) millimetres a depth camera is scaled from: the dataset's min/max, else the quantiser's range."""
    s = stats.get(key) or {}
    if "min" in s and "max" in s:
        lo, hi = float(np.min(s["min"])), float(np.max(s["max"]))
        if hi > lo:
            return lo, hi
    return cam.depth_min * MM_PER_METRE, cam.depth_max * MM_PER_METRE


def to_model_input(frames: np.ndarray, depth_mm: tuple[float, float] | None = None):
    """(N, H, W, C) decoded frames -> (N, 3, H, W) float32 tensor in [0, 1] (RGB / 255; depth scaled by
    `depth_mm` = (lo, hi) and repeated on three channels)."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(frames))
    if depth_mm is None:
        return x.permute(0, 3, 1, 2).float().div_(255)
    lo, hi = depth_mm
    d = ((x.float() - lo) / max(hi - lo, 1e-6)).clamp_(0, 1).permute(0, 3, 1, 2)
    return d.expand(-1, 3, -1, -1).contiguous()


def to_training_input(frames: np.ndarray, depth_mm: tuple[float, float] | None = None):
    """(N, H, W, C) decoded frames -> (N, 3, H, W) for a training batch: colour stays uint8 (a quarter of the
    bytes to stack, pin and copy; `PackedBatch.image_input` scales it to [0, 1] on the batch's device, the same
    float32 values `to_model_input` gives); depth as `to_model_input`."""
    import torch

    if depth_mm is not None:
        return to_model_input(frames, depth_mm)
    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
