"""`roboloop loop`: the closed loop without a Prefect server, in a fresh folder; a second run is all verified cache
hits, and the `closed-loop` flow on the same config finds the same receipts (the loop exists once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roboloop.registry import Registry

pytestmark = [pytest.mark.isaac, pytest.mark.slow, pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]


def _loop(cwd: Path, *args: str) -> tuple[dict, str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROBOLOOP_")}  # the defaults, under cwd
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "roboloop.cli", "loop", *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stdout, time.time() - t0


def test_roboloop_loop_in_a_fresh_folder_then_cached_then_the_flow_agrees(tmp_path, monkeypatch):
    first, text, _ = _loop(tmp_path, "--preset", "ci")
    assert "registry entry:" in text and "gate:" in text and first["registry_version"] == 1
    assert (tmp_path / ".dvc").is_dir() and (tmp_path / "data.dvc").is_file()  # versioned where it runs
    assert list((tmp_path / "artifacts" / "models").glob("*.dvc"))
    reg = Registry(tmp_path / ".roboloop" / "registry")
    assert reg.versions("reach-vla") == [1] and reg.lineage("reach-vla", 1)["baseline_eval"]["policy"] == "random"

    second, _, took = _loop(tmp_path, "--preset", "ci")
    same = ("dataset_md5", "weights_sha256", "eval_run", "registry_version", "success_rate")
    assert {k: second[k] for k in same} == {k: first[k] for k in same}  # every stage a (verified) cache hit
    assert took < 90, f"a cached rerun took {took:.0f} s"

    from flows.closed_loop import closed_loop
    from roboloop.loop import ci

    for k in ("ROBOLOOP_REGISTRY", "ROBOLOOP_ARTIFACTS", "ROBOLOOP_CACHE_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)
    s = closed_loop(cfg=ci())
    assert (s.dataset_md5, s.weights_sha256, s.eval_run, s.decision.version) == \
        (first["dataset_md5"], first["weights_sha256"], first["eval_run"], 1)
    assert s.decision.reused
