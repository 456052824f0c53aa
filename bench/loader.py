"""roboloop's v3 loader vs LeRobotDataset + DataLoader: samples/s, state/action only and with video.

    python bench/loader.py [--dataset V3_DIR] [--workers 2] [--batch 32] [--batches 40]
                           [--episodes 40] [--frames 200] [--cache-epochs 3] [--workdir bench/out]

Same data, same number of workers, action chunk 16. Without --dataset it generates two v3
datasets under --workdir once (with and without a 128x128 camera).

The two sides do not sample alike, and the JSON says so. LeRobot's DataLoader (shuffle=True)
draws frames uniformly at random, one video seek per sample. roboloop's training stream visits
windows of 32 consecutive frames in shuffled order through a 512-frame shuffle buffer, so one
sequential decode serves many samples (`ratio_state`, `ratio_video`: what training gets). To
separate that from the decoder, roboloop is also measured on uniform random access (windows of
one frame, no buffer: the same access pattern as LeRobot's): `ratio_uniform_state`,
`ratio_uniform_video`.

Training visits a small dataset for many epochs. `ratio_frame_cache` is roboloop's stream over
--cache-epochs whole epochs of the video dataset with the training default `frame_cache_mb` (2048:
a split whose decoded frames fit is decoded once) against the same stream with `frame_cache_mb` 0
(every epoch decodes again, as before the cache); same samples either way.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
H = 16


WINDOW, BUFFER = 32, 512  # the training stream's defaults (TrainConfig.window, shuffle_buffer)

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/loader.py", "roboloop/training/data.py", "roboloop/datasets"]


def ensure(path: Path, cameras: dict, episodes: int, frames: int) -> Path:
    if path.exists():
        return path
    from roboloop.datasets.convert import ConvertConfig, convert
    from roboloop.datasets.generate import GenSpec, generate_v21

    src = generate_v21(path.with_name(path.name + "_v21"), GenSpec(
        num_episodes=episodes, min_length=max(2, frames * 3 // 4), max_length=frames * 5 // 4, cameras=cameras,
        seed=1, noise=4))
    return convert(src, path, ConvertConfig(progress=False))


def ours(root: Path, workers: int, batch: int, batches: int, video: bool, uniform: bool = False,
         cache_mb: float = 0) -> float:
    import torch

    from roboloop.training.data import SampleStream, V3Dataset
    from roboloop.training.packing import collate

    ds = V3Dataset(root, horizon=H)
    window, buffer = (1, 1) if uniform else (WINDOW, BUFFER)
    stream = SampleStream(ds, image_size=(128, 128), max_text_len=96, num_workers=workers, with_video=video,
                          window=window, shuffle_buffer=buffer, cache_mb=cache_mb)
    keys = [stream.next_key() for _ in range(batch)]
    collate(stream.materialize(keys), 64)  # warm-up
    t0 = time.perf_counter()
    nxt = [stream.next_key() for _ in range(batch)]
    stream.prefetch(nxt)
    for _ in range(batches):
        cur, nxt = nxt, [stream.next_key() for _ in range(batch)]
        stream.prefetch(nxt)  # decode the next batch while this one is assembled
        b = collate(stream.materialize(cur), 64)
        assert b.actions.shape == (batch, H, b.actions.shape[-1])
    dt = time.perf_counter() - t0
    stream.close()
    del torch
    return batch * batches / dt


def lerobot(root: Path, workers: int, batch: int, batches: int, backend: str) -> float:
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    fps = json.loads((root / "meta/info.json").read_text())["fps"]
    ds = LeRobotDataset("bench/ds", root=root, delta_timestamps={"action": [i / fps for i in range(H)]},
                        video_backend=backend)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                         multiprocessing_context="spawn" if workers else None,
                                         persistent_workers=workers > 0)
    it = iter(loader)
    next(it)  # warm-up (workers started)
    t0 = time.perf_counter()
    for _ in range(batches):
        b = next(it)
        assert b["action"].shape[1] == H
    return batch * batches / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", type=Path, help="a v3 dataset with video (state-only uses a generated one)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--episodes", type=int, default=40, help="episodes of the generated datasets")
    ap.add_argument("--frames", type=int, default=200, help="mean frames per generated episode")
    ap.add_argument("--cache-epochs", type=int, default=3, help="epochs of the frame-cache comparison")
    ap.add_argument("--workdir", type=Path, default=HERE / "out", help="where generated datasets are kept")
    # torchcodec (LeRobot's default) returns the neighbouring frame for some timestamps of
    # multi-episode files and LeRobot raises FrameTimestampError, on LeRobot's own converted
    # output too; its PyAV backend decodes them right.
    ap.add_argument("--lerobot-backend", default="pyav", choices=["pyav", "torchcodec"])
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    size = f"{args.episodes}x{args.frames}"
    state_ds = ensure(args.workdir / f"loader_state_v3_{size}", {}, args.episodes, args.frames)
    video_ds = args.dataset or ensure(args.workdir / f"loader_video_v3_{size}", {"observation.images.top": (128, 128)},
                                      args.episodes, args.frames)
    vb = max(1, args.batches // 4)
    r = {
        "ours_state_sps": ours(state_ds, args.workers, args.batch, args.batches, video=False),
        "ours_uniform_state_sps": ours(state_ds, args.workers, args.batch, args.batches, video=False, uniform=True),
        "lerobot_state_sps": lerobot(state_ds, args.workers, args.batch, args.batches, args.lerobot_backend),
        "ours_video_sps": ours(video_ds, args.workers, args.batch, vb, video=True),
        "ours_uniform_video_sps": ours(video_ds, args.workers, args.batch, vb, video=True, uniform=True),
        "lerobot_video_sps": lerobot(video_ds, args.workers, args.batch, vb, args.lerobot_backend),
    }
    from roboloop.training.config import TrainRecipe
    from roboloop.training.data import V3Dataset

    epoch = args.cache_epochs * len(V3Dataset(video_ds)) // args.batch
    r["ours_video_epochs_frame_cache_sps"] = ours(video_ds, args.workers, args.batch, epoch, video=True,
                                                  cache_mb=TrainRecipe().frame_cache_mb)
    r["ours_video_epochs_no_frame_cache_sps"] = ours(video_ds, args.workers, args.batch, epoch, video=True)
    r = {k: round(v, 1) for k, v in r.items()}
    r["ratio_frame_cache"] = round(r["ours_video_epochs_frame_cache_sps"] / r["ours_video_epochs_no_frame_cache_sps"],
                                   2)
    for kind in ("state", "video"):
        r[f"ratio_{kind}"] = round(r[f"ours_{kind}_sps"] / r[f"lerobot_{kind}_sps"], 2)
        r[f"ratio_uniform_{kind}"] = round(r[f"ours_uniform_{kind}_sps"] / r[f"lerobot_{kind}_sps"], 2)
    emit({"workers": args.workers, "batch": args.batch, "chunk": H, "lerobot_backend": args.lerobot_backend,
          "ours_sampling": f"shuffled windows of {WINDOW} frames through a {BUFFER}-frame shuffle buffer",
          "ours_uniform_sampling": "uniform random frames (window 1, no buffer)",
          "lerobot_sampling": "uniform random frames (DataLoader shuffle=True)",
          "frame_cache": f"{args.cache_epochs} epochs of the video dataset, frame_cache_mb "
                         f"{TrainRecipe().frame_cache_mb} vs 0", **r}, MEASURES)


if __name__ == "__main__":
    main()
