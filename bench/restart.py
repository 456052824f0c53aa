"""Self-healing, timed: a rank of a two-rank training run killed (kill -9) mid-run; torchrun restarts the ranks, they
resume from the last checkpoint, and this measures the time from the kill to the first new step.

    python bench/restart.py [--steps 60] [--every 10] [--kill-at 25] [--nproc 2] [--fault kill|stop]
                            [--collective-timeout-s 10] [--hang-timeout-s 5]

What it runs: `roboloop.entry train` under torchrun (`--max-restarts 1`, as `roboloop train --max-restarts` and
the Kubernetes Job run it) on a small camera dataset it generates, the VLA's tiny preset at 32x32, gloo on this
machine's CPU. It watches rank 0's heartbeat.json (written after every step), kills rank 1 when the heartbeat
passes `--kill-at`, and notes when the heartbeat next says a step after the checkpoint it resumed from.

`--fault stop` stops rank 1 instead (SIGSTOP: a hung rank, alive but silent): rank 0's watch over its node's
heartbeats (roboloop.training.hang) kills it once it has been inside a step for `--hang-timeout-s`
(ROBOLOOP_HANG_TIMEOUT_S; or 10 x its median step, if more), and torchrun restarts them all the same way; the bound
is that timeout plus a restart. With `--hang-timeout-s` above `--collective-timeout-s`, the collective timeout finds
it instead (and torchrun's 30 s grace for a rank that does not stop on SIGTERM is added).

Figures: `restart_s` (kill -> first step after the resume: torchrun noticing, stopping the other rank, starting both
again, imports, the model, the checkpoint, the first step), `lost_steps` (steps since that checkpoint, trained
again), `step_s` (a step's time before the kill). Baseline: the thousand-GPU platform reports automatic restart within
30 s of a failure (arXiv 2603.11101) - `goal_s`. On a GPU node the restart adds CUDA's initialisation and NCCL's
rendezvous; the checkpoint's size grows with the model (`lost_steps` x `step_s` is what `--checkpoint-every-*`
trades against the checkpoint's cost).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/restart.py", "roboloop/training/train.py", "roboloop/training/checkpoint.py",
            "roboloop/training/resume.py", "roboloop/entry.py"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_pid(rank: int) -> int | None:
    """The training process of `rank` (its RANK in its environment), not torchrun."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"roboloop.entry\x00train" not in cmd or b"torch.distributed.run" in cmd or b"torchrun" in cmd:
                continue
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\x00")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(pid)
    return None


def _heartbeat(out: Path) -> int:
    try:
        return int(json.loads((out / "heartbeat.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=10, help="checkpoint every this many steps")
    ap.add_argument("--kill-at", type=int, default=25, help="kill rank 1 once rank 0's heartbeat passes this step")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--fault", choices=["kill", "stop"], default="kill")
    ap.add_argument("--collective-timeout-s", type=float, default=10.0)
    ap.add_argument("--hang-timeout-s", type=float, default=5.0, help="ROBOLOOP_HANG_TIMEOUT_S for the ranks")
    args = ap.parse_args()
    from roboloop.datasets.convert import ConvertConfig, convert
    from roboloop.datasets.generate import GenSpec, generate_v21
    from roboloop.training.config import LaunchConfig, TrainConfig
    from roboloop.training.distributed import torchrun_command
    from roboloop.training.launch import _child_env

    work = Path(tempfile.mkdtemp(prefix="roboloop-restart-"))
    src = generate_v21(work / "v21", GenSpec(num_episodes=4, min_length=12, max_length=20,
                                            cameras={"observation.images.top": (32, 32)}, seed=6))
    v3 = convert(src, work / "v3", ConvertConfig(progress=False))
    out = work / "run"
    cfg = TrainConfig(dataset=str(v3), output_dir=str(out), steps=args.steps, checkpoint_every_steps=args.every,
                      max_tokens=512, num_workers=1, device="cpu", lr=2e-3, warmup_steps=3,
                      model_overrides={"image_size": [32, 32], "horizon": 8})
    (work / "cfg.json").write_text(cfg.model_dump_json())
    cmd = torchrun_command(str(work / "cfg.json"), nproc_per_node=args.nproc, rdzv_endpoint=f"127.0.0.1:{_port()}",
                           max_restarts=1)
    with open(work / "torchrun.log", "w") as log:
        launch = LaunchConfig(nproc_per_node=args.nproc, max_restarts=1,
                              collective_timeout_s=args.collective_timeout_s)
        env = _child_env(launch, {"OMP_NUM_THREADS": "1",  # what `roboloop train --max-restarts 1` gives its ranks
                                  "ROBOLOOP_HANG_TIMEOUT_S": str(args.hang_timeout_s)})
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            figures = _watch(proc, out, args)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    emit({**figures, "goal_s": 30.0, "baseline": "automatic restart within 30 s of a failure (arXiv 2603.11101)",
          "nproc": args.nproc, "every": args.every, "fault": args.fault,
          "collective_timeout_s": args.collective_timeout_s, "hang_timeout_s": args.hang_timeout_s,
          "work": str(work)}, MEASURES)


def _watch(proc: subprocess.Popen, out: Path, args) -> dict:
    deadline = time.monotonic() + 900
    seen: list[tuple[float, int]] = []
    while (step := _heartbeat(out)) <= args.kill_at:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"training ended or stalled before step {args.kill_at} (see {out.parent}/torchrun.log)")
        if not seen or seen[-1][1] != step:
            seen.append((time.monotonic(), step))
        time.sleep(0.01)
    pid = _rank_pid(1)
    if pid is None:
        raise SystemExit("rank 1's process was not found")
    killed_at, t_kill = _heartbeat(out), time.monotonic()
    os.kill(pid, signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)
    resumed = killed_at // args.every * args.every
    while not (resumed < _heartbeat(out) <= resumed + 2 and _heartbeat(out) < killed_at):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"no step after the resume (see {out.parent}/torchrun.log)")
        time.sleep(0.01)
    restart_s = time.monotonic() - t_kill
    code = proc.wait(600)
    steady = [b[0] - a[0] for a, b in zip(seen, seen[1:], strict=False)][-10:]
    return {"restart_s": round(restart_s, 2), "killed_at_step": killed_at, "resumed_from": resumed,
            "lost_steps": killed_at - resumed, "step_s": round(sorted(steady)[len(steady) // 2], 3) if steady else None,
            "finished": code == 0 and (out / "model.safetensors").exists()}


if __name__ == "__main__":
    main()
