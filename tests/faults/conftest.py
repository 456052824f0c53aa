"""Fault injection: plant a fault, run the command a user would, then check four things.

1. the exit code, 2. that the message names the cause, 3. that no user file changed (hashes
before and after), 4. that no roboloop process or temporary folder is left behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21

ROOT = Path(__file__).resolve().parents[2]
DEBRIS = ("roboloop-tmp", ".partial", ".download-", "roboloop-lock", ".converting-")
SPEC = GenSpec(num_episodes=4, min_length=10, max_length=14, cameras={"observation.images.top": (32, 32)}, seed=3)


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 300) -> Result:
    """`roboloop ARGS` as a user runs it, in a child process."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    p = subprocess.run([sys.executable, "-m", "roboloop.cli", *map(str, args)], capture_output=True, text=True,
                       env=full_env, cwd=cwd or ROOT, timeout=timeout)
    return Result(p.returncode, p.stdout, p.stderr)


def tree_hash(root: Path) -> dict[str, str]:
    """Every file under `root` (symlinks as their target path), hashed."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def assert_no_debris(root: Path) -> None:
    left = [p.relative_to(root).as_posix() for p in root.rglob("*") if any(d in p.name for d in DEBRIS)]
    assert left == [], f"temporary files or folders left behind: {left}"


def assert_no_processes(marker: str, timeout: float = 10.0) -> None:
    """No process whose command line mentions `marker` (a test's temporary path) survives."""
    import psutil

    deadline = time.time() + timeout
    while True:
        alive = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                if p.pid != os.getpid() and marker in " ".join(p.info["cmdline"] or []):
                    alive.append((p.pid, " ".join(p.info["cmdline"])[:120]))
            except psutil.Error:
                continue
        if not alive or time.time() > deadline:
            break
        time.sleep(0.2)
    assert alive == [], f"processes left behind: {alive}"


def one_line_error(r: Result, *needles: str, code: int = 2) -> str:
    """The command failed with `code`, printed one error line naming every needle, and no traceback."""
    assert r.code == code, f"exit {r.code}, expected {code}:\n{r.text[-3000:]}"
    assert "Traceback" not in r.err, r.err[-3000:]
    line = next((ln for ln in r.err.splitlines() if "error:" in ln), "")
    for n in needles:
        assert n in r.err, f"{n!r} not in {r.err[-2000:]!r}"
    return line


@pytest.fixture(scope="session")
def v21_dataset(tmp_path_factory) -> Path:
    return generate_v21(tmp_path_factory.mktemp("faults") / "v21", SPEC, workers=1)


@pytest.fixture(scope="session")
def v3_dataset(v21_dataset, tmp_path_factory) -> Path:
    return convert(v21_dataset, tmp_path_factory.mktemp("faults") / "v3", ConvertConfig(progress=False))


@pytest.fixture(scope="session")
def tiny_model(v3_dataset, tmp_path_factory) -> Path:
    from roboloop.training.config import TrainConfig
    from roboloop.training.train import train

    out = tmp_path_factory.mktemp("faults") / "model"
    train(TrainConfig(dataset=str(v3_dataset), output_dir=str(out), steps=3, max_tokens=512,
                      model_overrides={"image_size": [32, 32], "horizon": 8}, checkpoint_every_steps=0))
    return out


def lineage(successes: int = 3, episodes: int = 10) -> dict:
    return {"git_commit": "abc123", "dataset_md5": "d41d8cd98f00b204e9800998ecf8427e.dir", "config": {"lr": 1e-3},
            "metrics": {"final_loss": 0.1}, "eval": {"successes": successes, "episodes": episodes},
            "baseline_eval": {"successes": 0, "episodes": episodes, "policy": "random"}}


@pytest.fixture
def registry(tmp_path, tiny_model):
    """A local registry holding reach-vla v1 (champion) and v2."""
    from roboloop.registry import Registry

    reg = Registry(tmp_path / "registry")
    for s in (3, 4):
        v = reg.register("reach-vla", tiny_model, lineage(s))
        reg.promote("reach-vla", v, margin=0.5)
    return reg


def user_tree(root: Path) -> Path:
    """A folder of a user's own files (what must never change)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "notes.txt").write_text("my notes\n")
    (root / "sub").mkdir(exist_ok=True)
    (root / "sub" / "data.bin").write_bytes(os.urandom(256))
    (root / "model.safetensors").write_bytes(b"not yours")
    (root / "sub" / "config.json").write_text(json.dumps({"mine": True}))
    return root


def mount_tmpfs(path: Path, size: str, readonly: bool = False) -> None:
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if readonly else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0 and os.geteuid() == 0:  # CI runs as root: a guarantee that silently skipped there is none
        pytest.fail(f"cannot mount a tmpfs as root ({r.stderr.strip()}): the disk-full and read-only checks must run")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or 'not permitted'}); needs root or CAP_SYS_ADMIN")


def umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)
