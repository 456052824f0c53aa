"""The Kubernetes entrypoint with the pod environment the GPU job template sets starts exactly one torchrun.

Ranks used to start as `roboloop train --config`, which rebuilt the launch settings from that same
environment (ROBOLOOP_NPROC_PER_NODE, ROBOLOOP_NNODES) and started a torchrun of their own. Ranks
now start through `python -m roboloop.entry`, which reads no launch settings.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def _count(marker: str) -> tuple[int, int]:
    """(torchruns, ranks) now running for `marker`. A process's child between its fork and its exec still shows its
    parent's command line (a busy machine stretches that moment: a second "torchrun" was caught once with two test
    workers), so a process counts only if its parent is not of its kind; a torchrun started by a rank (the old bug)
    still counts."""
    kinds: dict[int, tuple[str, int]] = {}
    for p in psutil.process_iter(["cmdline", "ppid"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if marker not in cmd:
            continue
        head = cmd.split()[:2]
        if "torch.distributed.run" in cmd or any(part.endswith("torchrun") for part in head):
            kinds[p.pid] = ("torchrun", p.info["ppid"])
        elif "roboloop.entry train" in cmd:
            kinds[p.pid] = ("rank", p.info["ppid"])
    own = [kind for kind, parent in kinds.values() if kinds.get(parent, ("", 0))[0] != kind]
    return own.count("torchrun"), own.count("rank")


def test_entrypoint_with_the_pod_environment_starts_one_torchrun(tmp_path):
    src = generate_v21(tmp_path / "v21", GenSpec(num_episodes=3, min_length=16, max_length=20,
                                                 cameras={"observation.images.top": (32, 32)}, seed=3))
    v3 = convert(src, tmp_path / "v3", ConvertConfig(progress=False))
    out = tmp_path / "shared" / "run"
    cfg = TrainConfig(dataset=str(v3), output_dir=str(out), steps=40, max_tokens=512, checkpoint_every_steps=0,
                      model_overrides={"image_size": [32, 32], "horizon": 8})
    cfg_file = tmp_path / "train_config.json"
    cfg_file.write_text(cfg.model_dump_json())
    pod_env = {**os.environ, "JOB_COMPLETION_INDEX": "0", "ROBOLOOP_NNODES": "1", "ROBOLOOP_NPROC_PER_NODE": "2",
               "OMP_NUM_THREADS": "1",
               "PATH": f"{Path(os.sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen(["bash", str(ROOT / "infra/k8s-entrypoint.sh"), "roboloop", "train", "--config",
                             str(cfg_file)], cwd=ROOT, env=pod_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    max_torchruns = max_ranks = 0
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline:
        t, r = _count(str(cfg_file.parent))
        max_torchruns, max_ranks = max(max_torchruns, t), max(max_ranks, r)
        time.sleep(0.1)
    output = proc.stdout.read()
    proc.stdout.close()
    assert proc.wait(60) == 0, output[-4000:]
    assert max_torchruns == 1, output[-4000:]
    assert max_ranks == 2
    assert json.loads(output.strip().splitlines()[-1])["ranks"] == 2
