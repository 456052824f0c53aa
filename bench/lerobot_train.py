"""LeRobot's ACT (or Diffusion) trained by roboloop's engine vs by `lerobot-train`: same dataset, policy config,
batch size, steps, device.

    python bench/lerobot_train.py [--height 480 --width 640 | --state-only 16] [--episodes 8] [--steps 20]
                                  [--batch 4] [--policy act|diffusion] [--device cpu|cuda]
                                  [--precision bf16 fp32] [--lookahead auto|on|off ...]

`--state-only E`: no camera; the state (6) and E values of observation.environment_state (PushT-keypoints
style, LeRobot's ENV input), written by LeRobot's own `LeRobotDataset` writer.

Baseline: `lerobot-train` (LeRobot 0.6.1: its LeRobotDataset + DataLoader with `--num-workers`, its training
loop) as a user runs it, in fp32 (its default, `use_amp=false`); and, when roboloop trains in bf16, also with
`--policy.use_amp=true` (accelerate's bf16 autocast, on CPU too), the same precision on both sides. Both on the
same device, one camera stored as h264 video at HxW (generated once under bench/out/). LeRobot decodes with
torchcodec where it is installed, else PyAV (the JSON says which); roboloop decodes with PyAV. roboloop runs
once per `--precision` (default: bf16 then fp32 where bf16 is native, on a CUDA GPU or a CPU with AMX or
AVX512-BF16; else fp32 alone).
Samples/s is measured over the steps after the first two: LeRobot's from its own per-step `updt_s` + `data_s`
log fields, roboloop's from its metrics.jsonl; peak RSS of each process tree is sampled every 20 ms. The final
loss of each is the mean of its last five steps (their data orders differ). Ends with one JSON line:
`ratio_samples_per_s` (roboloop's first run / `lerobot-train` as a user runs it, fp32), `final_loss_ratio`,
`rss_ratio` (the same two runs), `ratio_same_precision` (each roboloop precision against LeRobot at that
precision), `lerobot_runs` and `roboloop_runs`: each run's samples/s, loss, and roboloop's data wait and
batch-building fractions of a step and what it did to the convolutions.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ACT = {"dim_model": 256, "dim_feedforward": 1024, "n_encoder_layers": 2, "n_decoder_layers": 1,
       "chunk_size": 20, "n_action_steps": 20}
# the optimiser each side uses: LeRobot's preset for the policy, given to roboloop as flags
OPTIM = {"act": ["--lr", "1e-5", "--weight-decay", "1e-4", "--grad-clip", "10", "--warmup-steps", "0",
                 "--lr-schedule", "constant"],
         "diffusion": ["--lr", "1e-4", "--weight-decay", "1e-6", "--grad-clip", "10", "--warmup-steps", "500"]}
CONFIG = {"act": ACT, "diffusion": {}}  # Diffusion: LeRobot's defaults (ResNet-18 from scratch, U-Net 512-2048)

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/lerobot_train.py", "roboloop/training", "roboloop/policies", "roboloop/datasets"]


def run(cmd: list[str], cwd: Path) -> tuple[str, float]:
    """Output and peak RSS (MB) of the whole process tree."""
    import psutil

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    with open(cwd / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env)
        ps, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                peak = max(peak, ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True)))
            time.sleep(0.02)
    out = (cwd / "log.txt").read_text()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed:\n{out[-3000:]}")
    return out, peak / 2**20


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"


def state_dataset(args) -> Path:
    """State + environment state, no camera, written by LeRobot's `LeRobotDataset.create` / `add_frame`: a
    smooth random walk per episode (a learnable signal, unlike white noise)."""
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dst = args.workdir / f"state_v3_{args.episodes}x{args.frames}_env{args.state_only}"
    if (dst / "meta" / "info.json").is_file():
        return dst
    e = args.state_only
    names = [f"j{i}.pos" for i in range(6)]
    feats = {"observation.state": {"dtype": "float32", "shape": (6,), "names": names},
             "action": {"dtype": "float32", "shape": (6,), "names": names},
             "observation.environment_state": {"dtype": "float32", "shape": (e,), "names": [f"k{i}" for i in range(e)]}}
    ds = LeRobotDataset.create("bench/state", fps=10, features=feats, root=dst, robot_type="bench")
    rng = np.random.default_rng(0)
    for _ in range(args.episodes):
        walk = np.cumsum(rng.normal(scale=0.05, size=(args.frames + 1, 6 + e)), axis=0).astype(np.float32)
        for t in range(args.frames):
            ds.add_frame({"observation.state": walk[t, :6], "action": walk[t + 1, :6],
                          "observation.environment_state": walk[t, 6:], "task": "push the T"})
        ds.save_episode()
    ds.finalize()
    return dst


def dataset(args) -> Path:
    if args.state_only:
        return state_dataset(args)
    dst = args.workdir / f"act_v3_{args.episodes}x{args.frames}_{args.height}x{args.width}"
    if not (dst / "meta" / "info.json").is_file():
        subprocess.run([sys.executable, "-m", "roboloop.cli", "generate", str(dst), "--v3", "--num-episodes",
                        str(args.episodes), "--min-length", str(args.frames), "--max-length", str(args.frames),
                        "--camera", f"observation.images.top={args.height}x{args.width}"], check=True,
                       stdout=subprocess.DEVNULL)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--state-only", type=int, default=0, metavar="E",
                    help="no camera: state + E values of observation.environment_state (LeRobot's writer)")
    ap.add_argument("--shuffle-buffer", type=int, default=None,
                    help="roboloop's shuffle buffer (frames; default its own, 256) for --sample-order windows")
    ap.add_argument("--sample-order", choices=["auto", "windows", "uniform"], default="auto",
                    help="roboloop's train.sample_order (auto, its default: uniform without a camera, as "
                         "lerobot-train draws; windows with one)")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--frames", type=int, default=120)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2, help="LeRobot DataLoader workers / roboloop decode threads")
    ap.add_argument("--workdir", type=Path, default=HERE / "out")
    ap.add_argument("--policy", choices=sorted(CONFIG), default="act")
    ap.add_argument("--device", default="cpu", help="cpu or cuda: both trainers run there")
    ap.add_argument("--precision", nargs="+", choices=["bf16", "fp32", "native"], default=None,
                    help="roboloop runs once per value (native: bf16 where it is native, else fp32; default: bf16 "
                         "and fp32 where bf16 is native, else fp32)")
    ap.add_argument("--lookahead", nargs="+", choices=["auto", "on", "off"], default=["auto"],
                    help="roboloop runs once per value (its pipeline's lookahead; auto: on CUDA only)")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    ds = dataset(args)
    work = Path(tempfile.mkdtemp(prefix="lerobot_train_run-", dir=args.workdir))  # fresh each run, never reused

    cfg = CONFIG[args.policy]
    native = "bf16" if native_bf16(args.device) else "fp32"
    precisions = list(dict.fromkeys(native if p == "native" else p for p in args.precision or [native, "fp32"]))
    if "bf16" in precisions and not native_bf16(args.device):
        raise SystemExit(f"--precision bf16: {args.device} has no native bf16 here (roboloop refuses it on a CPU "
                         "without AMX or AVX512-BF16)")
    lerobot = {p: lerobot_run(args, ds, work / f"lerobot-{p}", amp=p == "bf16")
               for p in dict.fromkeys(["fp32", *precisions])}
    base = lerobot["fp32"]  # lerobot-train as a user runs it
    runs = [roboloop_run(args, ds, work / f"roboloop-{p}-{la}", la, p)
            for p, la in [(p, args.lookahead[0]) for p in precisions] + [(precisions[0], la)
                                                                          for la in args.lookahead[1:]]]
    first = runs[0]
    emit({
        "dataset": str(ds), "camera": None if args.state_only else f"{args.height}x{args.width}",
        "environment_state": args.state_only or None, "roboloop_shuffle_buffer": args.shuffle_buffer or 256,
        "roboloop_sample_order": first["sample_order"],
        "steps": args.steps, "batch": args.batch,
        "policy": args.policy, "config": cfg, "device": device_name(args.device), "cpus": os.cpu_count(),
        "lerobot_video_backend": "torchcodec" if importlib.util.find_spec("torchcodec") else "pyav",
        "baseline": "lerobot-train (LeRobot 0.6.1), same dataset/config/batch/device, fp32 (its default); "
                    "ratio_same_precision: also against its use_amp=true (bf16 autocast) where roboloop ran bf16",
        "roboloop_precision": first["precision"],
        "roboloop_samples_per_s": first["samples_per_s"], "lerobot_samples_per_s": base["samples_per_s"],
        "ratio_samples_per_s": round(first["samples_per_s"] / base["samples_per_s"], 2),
        "roboloop_final_loss": first["final_loss"], "lerobot_final_loss": base["final_loss"],
        "final_loss_ratio": round(first["final_loss"] / base["final_loss"], 3),
        "roboloop_peak_rss_mb": first["peak_rss_mb"], "lerobot_peak_rss_mb": base["peak_rss_mb"],
        "rss_ratio": round(first["peak_rss_mb"] / base["peak_rss_mb"], 2),
        "ratio_same_precision": {r["precision"]: round(r["samples_per_s"] / lerobot[p]["samples_per_s"], 2)
                     for p, r in zip(precisions, runs, strict=False)},
        "lerobot_runs": list(lerobot.values()),
        "roboloop_runs": [r | {"ratio_samples_per_s": round(r["samples_per_s"] / base["samples_per_s"], 2)}
              for r in runs]}, MEASURES)


def native_bf16(device: str) -> bool:
    from roboloop import availability

    return device.startswith("cuda") or availability.cpu_bf16() is not None


def lerobot_run(args, ds: Path, cwd: Path, amp: bool) -> dict:
    """`lerobot-train` on the dataset; samples/s from its own per-step `updt_s` + `data_s` log fields."""
    cwd.mkdir(parents=True)
    out, rss = run([sys.executable, "-m", "lerobot.scripts.lerobot_train", "--dataset.repo_id=bench/act",
                    f"--dataset.root={ds}", f"--policy.type={args.policy}",
                    "--policy.pretrained_backbone_weights=null", f"--policy.device={args.device}",
                    "--policy.push_to_hub=false", *[f"--policy.{k}={v}" for k, v in CONFIG[args.policy].items()],
                    f"--policy.use_amp={str(amp).lower()}", f"--steps={args.steps}", f"--batch_size={args.batch}",
                    f"--num_workers={args.workers}", "--log_freq=1", f"--save_freq={args.steps}", "--output_dir=out",
                    "--wandb.enable=false", "--seed=0"], cwd)
    rows = [(float(m[0]), float(m[1]), float(m[2])) for m in
            re.findall(r"loss:([0-9.e+-]+).*?updt_s:([0-9.e+-]+) data_s:([0-9.e+-]+)", out)]
    if len(rows) < args.steps:
        raise SystemExit(f"lerobot-train logged {len(rows)} steps, expected {args.steps}:\n{out[-2000:]}")
    sps = sum(args.batch / (u + d) for _, u, d in rows[2:]) / max(1, len(rows) - 2)
    return {"use_amp": amp, "samples_per_s": round(sps, 2),
            "final_loss": round(sum(r[0] for r in rows[-5:]) / len(rows[-5:]), 4), "peak_rss_mb": round(rss)}


def roboloop_run(args, ds: Path, cwd: Path, lookahead: str, prec: str) -> dict:
    """`roboloop train` on the same data and config; samples/s and the loop's data fractions from metrics.jsonl."""
    cwd.mkdir(parents=True)
    cfg = CONFIG[args.policy]
    _, rss = run([sys.executable, "-m", "roboloop.cli", "train", "--dataset", str(ds), "--output-dir", "out",
                  "--policy-type", args.policy, "--policy-config", json.dumps(cfg), "--steps", str(args.steps),
                  "--max-samples", str(args.batch), *OPTIM[args.policy], "--device", args.device,
                  "--precision", prec, "--num-workers", str(args.workers), "--checkpoint-every-steps", "0",
                  "--lookahead", lookahead, "--no-cache", "--sample-order", args.sample_order,
                  *(["--shuffle-buffer", str(args.shuffle_buffer)] if args.shuffle_buffer else [])], cwd)
    metrics = [json.loads(line) for line in (cwd / "out" / "metrics.jsonl").read_text().splitlines()]
    timed = metrics[2:] or metrics

    def mean(key: str) -> float:
        return sum(m[key] for m in timed) / len(timed)

    ran = metrics[0].get("run", {})
    return {"precision": ran.get("precision", prec), "conv_layout": ran.get("conv_layout"),
            "frozen_norms_folded": ran.get("frozen_norms_folded"), "relu_after_pool": ran.get("relu_after_pool"),
            "lookahead": lookahead,
            "sample_order": ran.get("sample_order", {}).get("sample_order"),
            "ran": metrics[0].get("pipeline"), "samples_per_s": round(mean("samples_per_s"), 2),
            "final_loss": round(sum(m["loss"] for m in metrics[-5:]) / len(metrics[-5:]), 4),
            "data_wait_fraction": round(mean("data_wait_fraction"), 3),
            "data_build_fraction": round(mean("data_build_fraction"), 3), "peak_rss_mb": round(rss)}

if __name__ == "__main__":
    main()
