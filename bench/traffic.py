"""The bytes a training step really puts on the wire, for `bench/scale.py --bytes-check`: two gloo ranks under
torchrun inside a network namespace of their own (so its loopback carries their traffic and nothing else), the
namespace's loopback byte counter read around runs of two lengths; the difference per step is what the step's
collectives moved (rendezvous, start-up and the last step's save cancel out). Needs root (`ip netns`), as the cluster
tests do; the namespace is removed on every exit."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

ARMS = [("ddp", "fp32", 1), ("ddp", "bf16", 1), ("ddp", "fp32", 2), ("fsdp", "fp32", 1), ("fsdp", "bf16", 1)]


def _lo_bytes(ns: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/dev"], capture_output=True, text=True,
                         check=True).stdout
    row = next(line for line in out.splitlines() if line.strip().startswith("lo:"))
    return int(row.split(":", 1)[1].split()[8])  # transmitted bytes (on loopback every byte is sent once)


def _run(ns: str, work: Path, cfg, steps: int) -> tuple[int, int, int]:
    """Bytes on the namespace's loopback while `cfg` trains `steps` steps on two ranks, and the model's size (the
    elements of the weights it saved), all and outside the blocks FSDP shards one by one."""
    from roboloop.training.distributed import torchrun_command

    run = cfg.model_copy(update={"steps": steps, "output_dir": str(work / f"out-{steps}-{os.urandom(3).hex()}")})
    path = work / f"{Path(run.output_dir).name}.json"
    path.write_text(run.model_dump_json())
    before = _lo_bytes(ns)
    cmd = torchrun_command(str(path), nproc_per_node=2, rdzv_endpoint="127.0.0.1:29500")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"training in {ns} failed: {done.stderr[-2000:]}")
    sent = _lo_bytes(ns) - before
    from safetensors import safe_open

    with safe_open(str(Path(run.output_dir) / "model.safetensors"), "pt") as f:
        sizes = {k: _numel(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118  (a safetensors file)
    root = sum(n for k, n in sizes.items() if not k.startswith(("blocks.", "head_blocks.")))
    return sent, sum(sizes.values()), root


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def check(model_bytes: Callable[..., float], short: int = 4, long: int = 12) -> dict:
    """Per arm (strategy, grad_reduce, accumulate): the measured bytes per optimizer step on two ranks, the model's
    count (`model_bytes(params, strategy, grad_reduce, ranks, root_params, "gloo")`, both ranks' sends), and their
    ratio."""
    if os.geteuid() != 0:
        return {"skipped": "needs root for a network namespace"}
    from roboloop.datasets.convert import ConvertConfig, convert
    from roboloop.datasets.generate import GenSpec, generate_v21
    from roboloop.training.config import TrainConfig

    work = Path(tempfile.mkdtemp(prefix="roboloop-traffic-"))
    src = generate_v21(work / "v21", GenSpec(num_episodes=4, min_length=12, max_length=20,
                                            cameras={"observation.images.top": (32, 32)}, seed=6))
    v3 = convert(src, work / "v3", ConvertConfig(progress=False))
    ns = f"rltb{os.getpid() % 100000}traffic"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        out = {"ranks": 2, "steps": [short, long], "arms": {}}
        for strategy, reduce, accumulate in ARMS:
            cfg = TrainConfig(dataset=str(v3), output_dir=str(work), max_tokens=256, num_workers=1, device="cpu",
                              checkpoint_every_steps=0, strategy=strategy, grad_reduce=reduce, accumulate=accumulate,
                              model_overrides={"image_size": [32, 32], "horizon": 8})
            (sent_long, params, root), (sent_short, _, _) = _run(ns, work, cfg, long), _run(ns, work, cfg, short)
            per_step = (sent_long - sent_short) / (long - short)
            model = model_bytes(params, strategy, reduce, 2, root, "gloo")
            out["arms"][f"{strategy}_{reduce}_acc{accumulate}"] = {
                "measured_bytes_per_step": round(per_step), "model_bytes_per_step": round(model),
                "ratio": round(per_step / model, 3), "params": params, "root_params": root}
        out["within_10_percent"] = all(abs(a["ratio"] - 1) <= 0.1 for a in out["arms"].values())
        return out
    finally:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            subprocess.run(["kill", "-9", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
