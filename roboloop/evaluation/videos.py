"""Rollout videos a person can judge, and a contact sheet to glance at.

Each kept episode's camera becomes an H.264 mp4 upscaled by an integer factor (nearest neighbour: pixels stay sharp,
nothing is invented) to at least MIN_SIDE pixels on its short side, with a caption band above the picture: the model
and version, the episode number, the outcome with its step count, the instruction, and the step being shown. The
contact sheet is one PNG: a row per kept episode, SHEET_FRAMES frames from its start to its end, the same caption.

    pick(kept, first_failure) -> the episodes to show (one failure among them whenever any episode failed)
    write_videos(episodes, out, fps, label) -> [mp4 paths]
    contact_sheet(episodes, png, label) -> png path | None
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

MIN_SIDE = 256  # short side of a video, after upscaling
SHEET_FRAMES, SHEET_SIDE = 6, 128  # a contact sheet's frames per row and their short side
OK, FAILED = (32, 140, 60), (190, 40, 40)


def pick(kept: list[dict], first_failure: dict | None) -> list[dict]:
    """The episodes to show: `kept` (the first ones to end), its last replaced by the first failure when every kept
    one succeeded and some episode failed (the failures are what a person learns from)."""
    if first_failure is None or not kept or any(not e["success"] for e in kept):
        return kept
    return [*kept[:-1], first_failure]


def caption(ep: dict, label: str) -> str:
    outcome = "SUCCESS" if ep["success"] else "FAILED"
    return f"{label}  episode {ep.get('episode', '?')}  {outcome} in {len(next(iter(ep['images'].values())))} steps"


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _band(width: int, lines: list[str], ok: bool, size: int) -> np.ndarray:
    """A caption band: the lines in white on dark grey, a green (success) or red (failure) bar at its left."""
    from PIL import Image, ImageDraw

    h = len(lines) * (size + 4) + 6
    img = Image.new("RGB", (width, h), (24, 24, 24))
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, 0, 5, h], fill=OK if ok else FAILED)
    font = _font(size)
    for j, line in enumerate(lines):
        draw.text((10, 3 + j * (size + 4)), line, fill=(235, 235, 235), font=font)
    return np.asarray(img)


def upscale(frames: np.ndarray, side: int) -> np.ndarray:
    """(T, H, W, 3) upscaled by the smallest integer factor that brings the short side to `side` (nearest)."""
    k = max(1, -(-side // min(frames.shape[1:3])))
    return frames.repeat(k, axis=1).repeat(k, axis=2) if k > 1 else frames


def write_videos(episodes: list[dict], out: Path, fps: int, label: str = "policy") -> list[str]:
    from roboloop.datasets.video import encode_frames

    paths = []
    for j, ep in enumerate(episodes):
        title = caption(ep, label)
        for cam, frames in ep["images"].items():
            tag = "success" if ep["success"] else "failure"
            p = out / "videos" / f"rollout{j:02d}_{cam.replace('.', '_')}_{tag}.mp4"
            big = upscale(np.stack(frames), MIN_SIDE)
            encode_frames(_captioned(big, title, ep.get("task", ""), ep["success"]), p, fps)
            paths.append(str(p))
    return paths


def _captioned(big: np.ndarray, title: str, task: str, ok: bool):
    """Each frame under its caption band (the title, then the step shown and the instruction)."""
    size = max(12, big.shape[2] // 22)
    for t, frame in enumerate(big):
        band = _band(frame.shape[1], [title, f"step {t + 1}/{len(big)}  {task}"], ok, size)
        yield _even(np.concatenate([band, frame], axis=0))


def _even(img: np.ndarray) -> np.ndarray:
    """yuv420p needs even sizes."""
    return img[:img.shape[0] - img.shape[0] % 2, :img.shape[1] - img.shape[1] % 2]


def contact_sheet(episodes: list[dict], png: Path, label: str = "policy") -> Path | None:
    """One row per episode (its first camera): SHEET_FRAMES frames from first to last, captioned."""
    from PIL import Image

    rows = []
    for ep in episodes:
        if not ep["images"]:
            continue
        frames = np.stack(next(iter(ep["images"].values())))
        at = np.linspace(0, len(frames) - 1, SHEET_FRAMES).round().astype(int)
        tiles = upscale(frames[at], SHEET_SIDE)
        strip = np.concatenate(list(tiles), axis=1)
        band = _band(strip.shape[1], [caption(ep, label), ep.get("task", "")], ep["success"], 13)
        rows.append(np.concatenate([band, strip], axis=0))
    if not rows:
        return None
    width = max(r.shape[1] for r in rows)
    rows = [np.pad(r, ((0, 4), (0, width - r.shape[1]), (0, 0))) for r in rows]
    png.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.concatenate(rows, axis=0)).save(png, optimize=True)
    return png
