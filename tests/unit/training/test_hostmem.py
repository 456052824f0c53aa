"""`host_memory`: glibc keeps a CPU step's freed activations for the next step instead of unmapping them. The
allocator is process-wide, so each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from roboloop.training import hostmem

FAULTS = """
import os, sys, torch
from roboloop.training import hostmem
print(hostmem.apply(sys.argv[1], "cpu"), file=sys.stderr)
def faults():
    return int(open(f"/proc/{os.getpid()}/stat").read().split()[9])
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(5, 32, 5, padding=2, stride=2), torch.nn.GELU(),
                          torch.nn.Conv2d(32, 32, 3, padding=1))
x = torch.rand(256, 5, 64, 96)  # an image encoder's step: 50 MB activations, allocated and freed every step
def step():
    net(x).square().mean().backward()
for _ in range(6):  # the heap settles
    step()
before = faults()
for _ in range(5):
    step()
print(faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts page faults in /proc")
def test_keep_reuses_freed_blocks_instead_of_faulting_them_in_again():
    def faults(mode: str) -> int:
        run = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
        assert run.stderr.startswith("keep" if mode == "keep" else "system"), run.stderr
        return int(run.stdout)

    kept, system = faults("keep"), faults("system")
    # 50 MB is above glibc's largest mmap threshold (32 MB), so without keep every such block is its own mapping
    # whatever the heap did before (at 25 MB the dynamic threshold sometimes took them into the heap: CI saw
    # 6,000 faults a step instead of 16,000); here ~233,000 faults a step
    assert system > 5 * (50 << 20) // 4096
    assert kept < system // 20, (kept, system)  # here 0 to ~5,000 a step


def test_auto_keeps_on_the_cpu_only_and_system_is_left_alone():
    assert hostmem.apply("auto", "cuda").startswith("system (host_memory auto, not a CPU run")
    assert hostmem.apply("system", "cpu").startswith("system (host_memory system")


TRAIN = """
import json, sys
from roboloop.training.config import TrainConfig
from roboloop.training.train import train
train(TrainConfig(dataset=sys.argv[1], output_dir=sys.argv[2], steps=3, max_tokens=512, checkpoint_every_steps=0,
                  host_memory=sys.argv[3], model_overrides={"image_size": [32, 32]}))
"""


def test_a_run_with_kept_memory_learns_exactly_what_a_run_without_does(tiny_v3, tmp_path):
    def losses(mode: str) -> tuple[list[float], str]:
        out = tmp_path / mode
        subprocess.run([sys.executable, "-c", TRAIN, str(tiny_v3), str(out), mode], check=True, capture_output=True)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows], rows[0]["run"]["host_memory"]

    (kept, said_kept), (system, said_system) = losses("keep"), losses("system")
    assert said_kept.startswith("keep (glibc") and said_system.startswith("system (host_memory system")
    assert kept == system and len(kept) == 3
