"""Warm workers (roboloop.warm): simulator stages after the first start in a worker that already imported and built
what it can. Its results are the cold child's, episode by episode; a crash or a refused model ends one worker and the
next stage gets a new one; a parent's SIGTERM or death reaches the worker within seconds."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from roboloop import warm
from roboloop.evaluation.config import EvalConfig
from roboloop.procs import ChildFailed
from roboloop.warm import run_entry
from tests.models import untrained_model

TASK = "Roboloop-Reach-Color-v0"
ROOT = Path(__file__).resolve().parents[2]


def _eval(out: Path, policy: str = "random", episodes: int = 6, lines: list | None = None, on_line=None) -> dict:
    seen = lines if lines is not None else []

    def keep(line: str) -> None:
        seen.append(line)
        if on_line:
            on_line(line)

    cfg = EvalConfig(policy=policy, task=TASK, episodes=episodes, num_envs=2, output_dir=str(out), videos=0, seed=3)
    run_entry("evaluate", cfg, out, keep, 300, f"evaluation of {policy}")
    return json.loads((out / "report.json").read_text())


def _worker(lines: list[str]) -> tuple[str, int]:
    """('new' or 'warm', the worker's pid) from the stage's first line."""
    m = next(re.match(r"\$ \[(new|warm) worker (\d+)\]", ln) for ln in lines if ln.startswith("$ "))
    assert m, lines[:3]
    return m.group(1), int(m.group(2))


def _episodes(report: dict) -> list[tuple]:
    return [(e["index"], e["success"], round(e["ret"], 6), e["length"]) for e in report["per_episode"]]


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setenv("ROBOLOOP_WARM_WORKERS", "1")
    warm.POOL.close()
    yield warm.POOL
    warm.POOL.close()


def test_a_warm_worker_gives_the_cold_childs_episodes_and_starts_faster(pool, tmp_path, monkeypatch):
    monkeypatch.setenv("ROBOLOOP_WARM_WORKERS", "0")
    cold_lines: list[str] = []
    t0 = time.perf_counter()
    cold = _eval(tmp_path / "cold", lines=cold_lines)
    cold_s = time.perf_counter() - t0
    assert any(ln.startswith("$ ") and ln.endswith(f"-m roboloop.entry evaluate {tmp_path}/cold/evaluate_config.json")
               for ln in cold_lines)  # a new interpreter
    monkeypatch.setenv("ROBOLOOP_WARM_WORKERS", "1")
    first: list[str] = []
    _eval(tmp_path / "expert", policy="expert", lines=first)  # another policy first: what it leaves must not matter
    again: list[str] = []
    t0 = time.perf_counter()
    hot = _eval(tmp_path / "warm", lines=again)
    warm_s = time.perf_counter() - t0
    assert _worker(first)[0] == "new" and _worker(again) == ("warm", _worker(first)[1])
    assert _episodes(hot) == _episodes(cold) and len(_episodes(cold)) == 6
    assert hot["initial_states_sha256"] == cold["initial_states_sha256"]
    assert warm_s < cold_s / 2, (warm_s, cold_s)  # ~1 s against ~6 s here


def test_a_crashed_worker_fails_its_stage_and_the_next_stage_gets_a_new_one(pool, tmp_path):
    lines: list[str] = []
    _eval(tmp_path / "a", lines=lines)
    _, pid = _worker(lines)

    def crash(line: str) -> None:
        if line.startswith("[progress]"):
            os.kill(pid, signal.SIGKILL)

    with pytest.raises(ChildFailed, match=r"evaluation of random failed \(exit -9\)"):
        _eval(tmp_path / "b", episodes=40, on_line=crash)
    after: list[str] = []
    report = _eval(tmp_path / "c", lines=after)
    kind, new_pid = _worker(after)
    assert kind == "new" and new_pid != pid and len(report["per_episode"]) == 6


def test_a_refused_model_ends_its_worker_and_runs_nothing(pool, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv("ROBOLOOP_TEST_HOSTILE_MARKER", str(marker))
    folder = untrained_model(tmp_path / "m", 6, 3, 8)
    (folder / "policy.json").write_text(json.dumps({
        "family": "tests.faults.test_hostile_models:Boom", "state_key": "observation.state", "action_key": "action",
        "state_dim": 6, "action_dim": 3, "horizon": 8}))
    lines: list[str] = []
    _eval(tmp_path / "a", lines=lines)
    _, pid = _worker(lines)
    with pytest.raises(ChildFailed, match="policy family 'tests.faults.test_hostile_models:Boom' is not allowed"):
        _eval(tmp_path / "b", policy=str(folder))
    assert not marker.exists() and _gone(pid, 5.0)  # the worker that was asked to load it is gone
    after: list[str] = []
    _eval(tmp_path / "c", lines=after)
    assert _worker(after)[0] == "new" and _worker(after)[1] != pid


PARENT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from roboloop.evaluation.config import EvalConfig
    from roboloop.warm import run_entry

    out = Path(sys.argv[1])
    for i, episodes in enumerate((2, int(sys.argv[2]))):
        cfg = EvalConfig(policy="random", task="TASK", episodes=episodes, num_envs=1, output_dir=str(out / str(i)),
                         videos=0)
        run_entry("evaluate", cfg, out / str(i), lambda line: print(line, flush=True), 300, "evaluation")
        print("DONE", i, flush=True)
    if sys.argv[3] == "wait":
        import time
        time.sleep(300)
""".replace("TASK", TASK))


def _parent(tmp_path: Path, episodes: int, then: str) -> tuple[subprocess.Popen, int]:
    """A parent process running two evaluations on one warm worker; returns it and the worker's pid once the
    second evaluation started (`then`: 'wait' keeps the parent alive after both)."""
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path), str(episodes), then], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "ROBOLOOP_WARM_WORKERS": "1"})
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.match(r"\$ \[warm worker (\d+)\]", line):
            return proc, int(m.group(1))
    raise AssertionError(f"the parent ended before its second evaluation (exit {proc.wait()})")


def _end(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_sigterm_to_the_parent_stops_the_warm_workers_stage_within_seconds(tmp_path):
    proc, pid = _parent(tmp_path, episodes=400, then="exit")
    try:
        time.sleep(1.0)  # well inside the 400 episodes
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) != 0
        assert _gone(pid, 5.0), psutil.Process(pid).cmdline()
    finally:
        _end(proc)


def test_an_idle_worker_ends_with_its_parent(tmp_path):
    proc, pid = _parent(tmp_path, episodes=2, then="wait")
    try:
        assert proc.stdout is not None
        assert any(line.startswith("DONE 1") for line in proc.stdout)  # both stages done; the worker is idle
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        proc.kill()  # no handler runs: the worker learns it from its closed stdin
        assert _gone(pid, 5.0)
    finally:
        _end(proc)
