"""RL on Ray against the real reach task: an async run with 2 Isaac Lab env workers keeps within its staleness
bound, advances the weights version, publishes a loadable model, resumes from its checkpoint, and leaves no
Ray process behind, whether it ends or is cancelled (SIGTERM to its process group, as Prefect does)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.models import untrained_model

pytestmark = [pytest.mark.isaac, pytest.mark.slow]


def _untrained_model(path):
    """A randomly initialised tiny VLA for the reach task (18-dim state, 2-dim actions): RL mechanics only."""
    return untrained_model(path, state_dim=18, action_dim=2, horizon=8, state_std=0.3, action_std=0.5)


MARK = "ROBOLOOP_TEST_RAY_RUN"  # in this test's runs' environment, which their Ray processes inherit


def _ray_processes(since: float, marker: str) -> list[str]:
    """This test's Ray processes (another test worker may run a Ray cluster of its own meanwhile)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline", "create_time", "name"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if p.info["create_time"] >= since - 1 and ("ray::" in cmd or "raylet" in cmd or "gcs_server" in cmd
                                                       or "ray/dashboard" in cmd or "ray/_private" in cmd) \
                    and p.environ().get(MARK) == marker:
                found.append(f"{p.pid} {cmd[:80]}")
        except psutil.Error:
            continue
    return found


def _none_left(since: float, marker: str, wait_s: float = 30.0) -> list[str]:
    deadline = time.time() + wait_s
    while (left := _ray_processes(since, marker)) and time.time() < deadline:
        time.sleep(1)
    return left


def _cfg(model, out, env_steps):
    from roboloop.rl.config import RLConfig

    return RLConfig(policy=str(model), output_dir=str(out), mode="async", env_steps=env_steps, env_workers=2,
                    envs_per_worker=4, segment_decisions=4, segments_per_update=2, max_staleness=1,
                    epochs=1, minibatch=32, critic_warmup_updates=1, checkpoint_every=1, x0="zero")


def test_async_run_stays_within_staleness_resumes_and_shuts_down(tmp_path, monkeypatch):
    from roboloop.policies.vla import ModelPolicy
    from roboloop.rl.run import read_metrics, rl_in_subprocess

    monkeypatch.setenv(MARK, str(tmp_path))
    model = _untrained_model(tmp_path / "bc")
    out = tmp_path / "rl"
    t0 = time.time()
    lines: list[str] = []
    result = rl_in_subprocess(_cfg(model, out, env_steps=5 * 256), on_line=lines.append)
    rows = read_metrics(out)
    assert [r["version"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 3, rows
    assert all(r["staleness_max"] <= 1 for r in rows), [r["staleness_max"] for r in rows]
    assert rows[0]["critic_only"] and not rows[-1]["critic_only"]
    assert all(0 < r["cpu_busy"] <= 1 for r in rows), [r["cpu_busy"] for r in rows]  # the workers used the cores
    assert result["updates"] == len(rows) and result["env_steps"] >= 5 * 256 and result["staleness_max"] <= 1
    assert any(ln.startswith("[progress] rl: update") for ln in lines)
    published = ModelPolicy(result["model_dir"])  # loads like any trained model
    conf = json.loads((out / "model" / "config.json").read_text())
    assert conf["rl"]["parent"] == str(model) and conf["rl"]["updates"] == len(rows)
    assert (out / "model" / "model.safetensors").read_bytes() != (model / "model.safetensors").read_bytes()
    assert published.cfg.state_dim == 18
    assert published.cfg.initial_noise == "zero"  # it acts from the x_0 it was fine-tuned with
    assert _none_left(t0, str(tmp_path)) == [], "Ray processes outlived the run"

    # a second run with a larger budget resumes at the last checkpoint; SIGTERM to its group (a cancelled
    # flow run) after its first new update ends it with nothing left behind
    (tmp_path / "cfg.json").write_text(_cfg(model, out, env_steps=40 * 256).model_dump_json())
    t1 = time.time()
    seen: list[str] = []
    with subprocess.Popen([sys.executable, "-m", "roboloop.entry", "rl", str(tmp_path / "cfg.json")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if line.startswith("[progress] rl:") and "learner on" not in line:
                    seen.append(line.strip())
                if any("update" in s for s in seen):
                    assert _ray_processes(t1, str(tmp_path)), "this run's Ray processes are not found"
                    break
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.communicate(timeout=60)  # the driver stops Ray and exits on SIGTERM (no SIGKILL needed)
            code = proc.returncode
    assert code != 0
    assert seen and seen[0].startswith(f"[progress] rl: resumed at version {len(rows)}"), seen
    assert f"update {len(rows) + 1}" in seen[1], seen
    assert _none_left(t1, str(tmp_path)) == [], "Ray processes outlived the cancelled run"

