"""Two CPU ranks (gloo, launched through torchrun) train like one process on the same global batch, with the model's
blocks compiled (DDP and FSDP2 wrap the compiled blocks) as eager, each rank accumulating two micro-batches per step
(gradients synchronised at the second only: DDP's no_sync, FSDP2's set_requires_gradient_sync)."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.training.config import TrainConfig
from roboloop.training.distributed import torchrun_command
from roboloop.training.train import train


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    src = generate_v21(root / "v21", GenSpec(num_episodes=4, min_length=12, max_length=20,
                                            cameras={"observation.images.top": (32, 32)}, seed=6))
    return convert(src, root / "v3", ConvertConfig(progress=False))


def _losses(out):
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_match_one_rank(v3, tmp_path):
    common = dict(dataset=str(v3), steps=20, lr=2e-3, warmup_steps=5, checkpoint_every_steps=0, num_workers=1,
                  model_overrides={"image_size": [32, 32], "horizon": 8}, device="cpu")
    single = TrainConfig(output_dir=str(tmp_path / "one"), max_tokens=1024, **common)
    train(single)
    double = TrainConfig(output_dir=str(tmp_path / "two"), max_tokens=256, accumulate=2, compile="on",
                         **common)  # DDP + compile, 2 ranks x 2 micro-batches of the one process's pack
    cfg_file = tmp_path / "two.json"
    cfg_file.write_text(double.model_dump_json())
    cmd = torchrun_command(str(cfg_file), nproc_per_node=2, rdzv_endpoint=f"127.0.0.1:{_port()}")
    # Watchdog: a deadlocked rank fails the test instead of hanging CI.
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(one) == len(two) == 20
    assert abs(one[-1] - two[-1]) <= 1e-3, (one[-3:], two[-3:])  # compiled vs eager: test_compile's bound
    assert max(abs(a - b) for a, b in zip(one, two, strict=True)) <= 1e-3
    run = json.loads((tmp_path / "two" / "metrics.jsonl").read_text().splitlines()[0])["run"]["compile"]
    assert run["compiled"] and run["regions"] > 0, run
    assert (tmp_path / "two" / "model.safetensors").exists()


@pytest.mark.multigpu
def test_two_cuda_ranks_over_nccl_match_one_rank(v3, tmp_path):
    """The same check on two GPUs: DDP over NCCL, launched through torchrun."""
    common = dict(dataset=str(v3), steps=10, lr=2e-3, warmup_steps=2, checkpoint_every_steps=0, num_workers=1,
                  model_overrides={"image_size": [32, 32], "horizon": 8}, device="cuda", precision="fp32",
                  deterministic=True)
    train(TrainConfig(output_dir=str(tmp_path / "one"), max_tokens=1024, **common))
    cfg_file = tmp_path / "two.json"
    cfg_file.write_text(TrainConfig(output_dir=str(tmp_path / "two"), max_tokens=512, **common).model_dump_json())
    cmd = torchrun_command(str(cfg_file), nproc_per_node=2, rdzv_endpoint=f"127.0.0.1:{_port()}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert len(one) == len(two) == 10 and max(abs(a - b) for a, b in zip(one, two, strict=True)) <= 1e-3


def _cli(*args: str) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run([sys.executable, "-m", "roboloop.cli", *args], capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_fsdp_two_ranks_match_one_and_write_sharded_checkpoints(v3, tmp_path):
    """`roboloop train --nproc-per-node 2 --strategy fsdp --compile on`: the same losses as one eager process, DCP
    checkpoints, compiled blocks inside FSDP2's shards. (Resuming them, on another number of ranks too, is
    tests/cluster/test_fsdp_hosts.py's.)"""
    over = {"image_size": [32, 32], "horizon": 8}
    one = TrainConfig(output_dir=str(tmp_path / "one"), max_tokens=1024, dataset=str(v3), steps=20, lr=2e-3,
                      warmup_steps=5, num_workers=1, device="cpu", checkpoint_every_steps=0, model_overrides=over)
    train(one)
    fsdp = TrainConfig(**{**one.model_dump(), "output_dir": str(tmp_path / "fsdp"), "max_tokens": 256,
                          "accumulate": 2, "strategy": "fsdp", "checkpoint_every_steps": 10, "compile": "on"})
    cfg_file = tmp_path / "fsdp.json"
    cfg_file.write_text(fsdp.model_dump_json())
    port = f"127.0.0.1:{_port()}"
    proc = _cli("train", "--config", str(cfg_file), "--nproc-per-node", "2", "--rdzv-endpoint", port)
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ranks"] == 2
    rows = [json.loads(line) for line in (tmp_path / "fsdp" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["run"]["compile"]["compiled"] and rows[0]["run"]["compile"]["regions"] > 0, rows[0]["run"]
    assert rows[-1]["compile"]["graph_breaks"] == 0, rows[-1]["compile"]
    ref, got = _losses(tmp_path / "one"), _losses(tmp_path / "fsdp")
    assert max(abs(a - b) for a, b in zip(ref, got, strict=True)) <= 1e-3  # compiled vs eager: test_compile's bound
    ckpt = tmp_path / "fsdp" / "checkpoints" / "step-00000010"
    assert (ckpt / ".metadata").exists() and (ckpt / "extra.pt").exists()  # DCP shards, not a torch.save
    from safetensors.torch import load_file

    from roboloop.training.config import ModelConfig
    from roboloop.training.model import VLAPolicy

    full = load_file(tmp_path / "fsdp" / "model.safetensors")  # gathered, unsharded weights
    mcfg = ModelConfig(**json.loads((tmp_path / "fsdp" / "config.json").read_text())["model"])
    VLAPolicy(mcfg).load_state_dict(full)  # strict: every weight, full shapes


def test_launcher_timeout_kills_every_rank(v3, tmp_path):
    """The torchrun child runs in its own process group; a timeout (or cancel) leaves no rank behind."""
    import os

    from roboloop.training.launch import LaunchConfig, run_torchrun

    cfg = TrainConfig(dataset=str(v3), output_dir=str(tmp_path / "out"), steps=100000, device="cpu", num_workers=1,
                      checkpoint_every_steps=0, model_overrides={"image_size": [32, 32], "horizon": 8})
    lines: list[str] = []
    with pytest.raises(TimeoutError, match="torchrun and its ranks.*killed its process group"):
        run_torchrun(cfg, LaunchConfig(nproc_per_node=2, rdzv_endpoint=f"127.0.0.1:{_port()}", timeout_s=15),
                     on_line=lines.append)
    assert any("torch" in line for line in lines)
    marker = str(tmp_path / "out" / "train_config.json")
    survivors = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).find(marker) >= 0]
    assert survivors == [], [_cmdline(p) for p in survivors]


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""
