"""The benches' smoke runs, started when the session starts and run beside the other tests: in one pytest process
(`make test TEST_WORKERS=0`). In pytest-xdist workers (`make test`) each runs in its own test, as a work unit of
its own (tests/schedule.py): the workers keep the cores busy.

At their smallest settings a bench is mostly interpreter and simulator start-up on one core, and much of the suite
leaves a core idle (the simulator steps on one: 46% idle through the SO-101 tests here). So the runs start with
the session's first test, one at a time, one thread each, at `nice 5` (the suite's own tests keep the cores
first; a run still gets about a quarter of one while they use both), and their tests come last and wait for
them. When the first of those starts waiting, a second lane opens. The Ray benches (rl, serve) wait for that
lane: the suite's own tests start local Ray clusters too, and two clusters on a 2-core machine are what a test
should not depend on. Every run gets its own PREFECT_HOME and a copy of the environment as it was when the
session started (no test's monkeypatched variable leaks into a run).

The fresh-clone demo stays in the foreground: its training uses both cores, and niced beside a test that trains
too it ran 14x slower (42 samples/s; its threads wait for each other while one is descheduled).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from concurrent.futures import Future
from pathlib import Path

import pytest

from tests.processes import kill_leftovers

ROOT = Path(__file__).resolve().parents[2]
TEST = "test_bench_runs_to_its_json_line"

# bench -> (smallest arguments, keys its last JSON line must carry, extra markers)
BENCHES: dict[str, tuple[list[str], set[str], list]] = {
    "convert": (["--episodes", "2", "--frames", "8", "--workdir", "{tmp}"], {"ratio", "rss_ratio"}, []),
    "loader": (["--episodes", "3", "--frames", "40", "--batch", "4", "--batches", "4", "--workers", "1",
                "--workdir", "{tmp}"], {"ratio_state", "ratio_video", "ratio_uniform_state", "ratio_uniform_video",
                                        "ours_sampling", "lerobot_sampling"}, []),
    "packing": (["--samples", "12", "--steps", "1", "--preset", "tiny"],
                {"speedup", "speedup_vs_fixed", "nonpad_fraction", "padded_batch_nonpad_fraction",
                 "padded_fixed_nonpad_fraction"}, []),
    "eval": (["--envs", "1"], {"results", "task"}, [pytest.mark.isaac]),
    "overhead": (["--tasks", "3", "--flows", "1"], {"task_overhead_ms", "flow_overhead_s"}, []),
    "startup": (["--episodes", "2", "--runs", "1"], {"help_s", "validate_s", "eval_cold_s", "eval_warm_s",
                                                   "eval_same_episodes"}, [pytest.mark.isaac]),
    "contention": (["--steps", "4", "--warmup", "2", "--episodes", "2", "--work", "{tmp}"],
                   {"kept_spin", "kept_roboloop", "target_met"}, []),
    "gate": (["--runs", "20"], {"rows", "baseline", "worst_worse_promoted_early_stop"}, []),
    "suite": (["--workers", "0", "--log", "{tmp}/suite.log", "tests/unit/test_hashing.py"],
              {"passed", "failed", "wall_minutes", "ci_budget_ratio"}, []),
    "gpu_check": (["--only", "compile_vla", "gpu_tests"], {"device", "commit", "parts"}, [pytest.mark.gpu]),
    "compile": (["--kinds", "vla", "--steps", "4", "--warmup", "2", "--episodes", "2", "--work", "{tmp}"],
                {"speedup_vla", "vla"}, []),
    "robustness": (["--demos", "4", "--steps", "3", "--episodes", "2", "--perturb", "obs_noise=0.02", "--latency",
                    "50", "--work", "{tmp}"], {"policy", "expert", "train_minutes"}, [pytest.mark.isaac]),
    "dagger": (["--demos", "4", "--rounds", "1", "--episodes", "2", "--round-episodes", "2", "--steps", "3",
                "--round-steps", "2", "--work", "{tmp}"], {"success_by_round", "gain"}, [pytest.mark.isaac]),
    "policy": (["--demos", "4", "--steps", "3", "--episodes", "2", "--skip-vision", "--work", "{tmp}"],
               {"state_success", "expert_success", "random_success"}, [pytest.mark.isaac]),
    "rl": (["--demos", "4", "--bc-steps", "3", "--episodes", "2", "--env-steps", "256", "--modes", "sync",
            "--rl", json.dumps({"env_workers": 1, "envs_per_worker": 4, "segment_decisions": 4,
                                "segments_per_update": 2, "epochs": 1, "minibatch": 16, "critic_warmup_updates": 0}),
            "--work", "{tmp}"], {"success_before", "success_after", "gain", "sync_env_steps_per_s"},
           [pytest.mark.isaac]),
    "sweep": (["--demos", "6", "--steps", "4", "--every", "2", "--episodes", "2", "--work", "{tmp}"],
              {"scores", "best_step", "checkpoints"}, [pytest.mark.isaac]),
    "so101": (["--episodes", "2", "--num-envs", "2", "--speed-steps", "3"],
              {"env_steps_per_s_cameras", "env_steps_per_s_no_cameras", "speed", "expert", "random"},
              [pytest.mark.isaac]),
    "inference": (["--preset", "demo", "--demos", "4", "--steps", "3", "--episodes", "2", "--num-envs", "2",
                   "--variants", "base", "k2", "--work", "{tmp}"], {"variants", "baseline"},
                  [pytest.mark.isaac]),
    "sim_to_sim": (["--episodes", "2", "--eval-episodes", "2", "--work", "{tmp}"],
                   {"kinematic_gap_mm", "replay_matched", "replay_shipped", "expert_closed_loop"},
                   [pytest.mark.isaac]),
    "so101_data": (["--record", "{tmp}/demos", "--episodes", "4", "--noise", "0"],
                   {"reference_roll_fit", "datasets"}, [pytest.mark.isaac]),
    "serve": (["--requests", "5", "--seconds", "0.5", "--clients", "1", "2", "--families", "vla", "--ray-replicas"],
              {"rows", "baseline"},
              [pytest.mark.isaac]),
    "precision": (["--presets", "small", "--steps", "2"], {"device", "fp8_backend", "small"}, [pytest.mark.gpu]),
    "optim": (["--models", "vla_tiny", "act256", "--steps", "3"], {"models", "baseline"}, []),
    "scale": (["--presets", "small", "--measure", "small", "--measure-tokens", "640", "--gpus", "8", "16"],
              {"presets", "baseline", "published", "measured_here"}, []),
    "activations": (["--smoke"], {"saved_ratio", "peak_rss_ratio", "time_ratio", "grad_max_rel_diff", "baseline"}, []),
    "restart": (["--steps", "24", "--every", "8", "--kill-at", "10"], {"restart_s", "lost_steps", "goal_s",
                                                                        "baseline", "finished"}, []),
    "act_step": (["--height", "32", "--width", "48", "--batch", "2", "--steps", "1", "--profile-steps", "1"],
                 {"step_ms", "roboloop_profile_shares", "conv_gflops_per_s", "ceiling_vs_lerobot_fp32",
                  "lerobot_host_memory"}, []),
    "lerobot_train": (["--height", "32", "--width", "48", "--episodes", "2", "--frames", "24", "--steps", "3",
                       "--batch", "2", "--workers", "1", "--workdir", "{tmp}", "--precision", "native"],
                      {"ratio_samples_per_s", "final_loss_ratio", "rss_ratio"}, []),
}

# longest first (seconds measured one at a time on a faster machine: so101 117, dagger 104, rl 90, policy 81,
# lerobot_train 77, sweep 64, eval 60, loader 58, the rest under 40 each), so what is left when the suite's own
# tests end is short
ORDER = ["so101", "dagger", "policy", "lerobot_train", "sweep", "eval", "loader", "robustness", "inference",
         "compile", "sim_to_sim", "so101_data", "precision", "gpu_check", "convert", "packing", "overhead", "startup",
         "contention",
         "gate", "suite", "optim", "act_step", "scale", "activations", "restart"]
RAY = ["rl", "serve"]  # one after the other, in the lane that opens when the suite's own tests are done
NICE = 5
RUN_TIMEOUT_S = 1800  # one run; a niced run beside busy tests takes up to ~3x its time alone


def is_bench_item(item) -> bool:
    return getattr(item, "originalname", "") == TEST and hasattr(item, "callspec")


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


class BenchRuns:
    """Each selected bench's run, as a Future of its CompletedProcess."""

    def __init__(self, names: set[str], tmp_path_factory, background: bool = True) -> None:
        self.background = background
        self.futures: dict[str, Future] = {n: Future() for n in names}
        self._queue = deque(n for n in ORDER if n in names)
        self._ray = deque(n for n in RAY if n in names)
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self._tmp = tmp_path_factory
        self._threads: list[threading.Thread] = []
        self._closing = False
        # one thread each; TMPDIR as is (Ray's socket paths must stay short); a niced Prefect server start beside
        # busy tests may take longer than the 90 s the Makefile allows
        self._env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                     "OPENBLAS_NUM_THREADS": "1", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}
        self._foreground_done = False
        if set(ORDER) | set(RAY) != set(BENCHES):
            raise AssertionError("every bench is in ORDER or RAY")

    def start(self) -> None:
        if self.background:
            self._lane(nice=NICE, ray_first=False)

    def foreground_done(self) -> None:
        """The suite's own tests are over: a second lane, which takes the Ray benches first."""
        with self._lock:
            if self._foreground_done:
                return
            self._foreground_done = True
        self._lane(nice=0, ray_first=True)

    def result(self, name: str, timeout: float) -> subprocess.CompletedProcess:
        if not self.background:  # run now, in the test (a pytest-xdist worker: tests/schedule.py)
            return self._run(name, nice=0)
        self.foreground_done()
        return self.futures[name].result(timeout=timeout)

    def close(self) -> None:
        """The session ends: stop what still runs (an interrupted session leaves no bench behind)."""
        self._closing = True
        with self._lock:
            self._queue.clear()
            self._ray.clear()
            procs = list(self._procs)
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for t in self._threads:
            t.join(timeout=30)

    def _lane(self, nice: int, ray_first: bool) -> None:
        t = threading.Thread(target=self._work, args=(nice, ray_first), daemon=True, name=f"bench-lane-{nice}")
        self._threads.append(t)
        t.start()

    def _next(self, ray_first: bool) -> str | None:
        with self._lock:
            if ray_first and self._ray:
                return self._ray.popleft()
            return self._queue.popleft() if self._queue else None

    def _work(self, nice: int, ray_first: bool) -> None:
        while not self._closing and (name := self._next(ray_first)) is not None:
            try:
                self.futures[name].set_result(self._run(name, nice))
            except Exception as e:  # the test that waits for it reports it
                self.futures[name].set_exception(e)

    def _run(self, name: str, nice: int) -> subprocess.CompletedProcess:
        tmp = self._tmp.mktemp(name)
        args = [a.replace("{tmp}", str(tmp)) for a in BENCHES[name][0]]
        cmd = [sys.executable, str(ROOT / "bench" / f"{name}.py"), *args]
        home = self._tmp.mktemp(f"{name}-prefect-home")
        # its record (bench/record.py) goes beside its run, never into the checkout's bench/results/
        env = {**self._env, "PREFECT_HOME": str(home), "ROBOLOOP_BENCH_RESULTS": str(tmp / "records")}
        if nice:
            cmd = ["nice", "-n", str(nice), *cmd]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)  # its own group: close() stops its children too
        with self._lock:
            self._procs.add(proc)
        try:
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n[killed after {RUN_TIMEOUT_S} s]"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # what it left in its group (a Prefect server, Ray)
            for marker in (tmp, home):  # and what left the group, by its folder or its Prefect server's home
                kill_leftovers(str(marker))
            with self._lock:
                self._procs.discard(proc)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def selected_benches(items) -> set[str]:
    """The benches whose smoke test is selected and not skipped."""
    return {item.callspec.params["name"] for item in items
            if is_bench_item(item) and not item.get_closest_marker("skip")}
