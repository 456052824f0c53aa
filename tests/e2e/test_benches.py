"""Every benchmark the README lists runs to its JSON line, at the smallest settings.

Last round `bench/eval.py` built a model for a 12-dim state the task no longer had, crashed, and `make
bench` stopped before `bench/overhead.py`; nobody noticed because no test ran a bench. These runs
check that each bench still works end to end and prints the numbers the README quotes (its keys), not
what the numbers are: at these sizes they mean nothing. The README's list and this one must agree.

They run two at a time, one thread each (`LANES`): at these sizes a bench is mostly interpreter and simulator
start-up on one core, and one after another they cost CI 11 minutes. The Ray benches share a lane.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow]

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
    "startup": ([], {"help_s", "validate_s"}, []),
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
    "so101": (["--episodes", "2", "--num-envs", "2", "--speed-steps", "3", "--speed-envs", "1"],
              {"env_steps_per_s_cameras", "env_steps_per_s_no_cameras", "speed", "expert", "random"},
              [pytest.mark.isaac]),
    "inference": (["--preset", "demo", "--demos", "4", "--steps", "3", "--episodes", "2", "--num-envs", "2",
                   "--variants", "base", "zero", "k2", "e2", "--work", "{tmp}"], {"variants", "baseline"},
                  [pytest.mark.isaac]),
    "so101_data": (["--record", "{tmp}/demos", "--episodes", "4", "--noise", "0"],
                   {"reference_roll_fit", "datasets"}, [pytest.mark.isaac]),
    "serve": (["--requests", "5", "--seconds", "0.5", "--clients", "1", "2", "--families", "vla", "--ray-replicas"],
              {"rows", "baseline"},
              [pytest.mark.isaac]),
    "precision": (["--presets", "small", "--steps", "2"], {"device", "fp8_backend", "small"}, [pytest.mark.gpu]),
    "lerobot_train": (["--height", "32", "--width", "48", "--episodes", "2", "--frames", "24", "--steps", "3",
                       "--batch", "2", "--workers", "1", "--workdir", "{tmp}"],
                      {"ratio_samples_per_s", "final_loss_ratio", "rss_ratio"}, []),
}


def test_the_readme_lists_exactly_these_benches():
    readme = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"bench/(\w+)\.py", readme))
    assert listed == set(BENCHES), f"README lists {sorted(listed)}; smoke-tested: {sorted(BENCHES)}"
    makefile = set(re.findall(r"bench/(\w+)\.py", (ROOT / "Makefile").read_text()))
    assert makefile <= set(BENCHES)


# two lanes of about equal length (seconds measured one at a time: so101 117, dagger 104, rl 90, policy 81,
# lerobot_train 77, sweep 64, eval 60, loader 58, the rest under 40 each); the Ray benches (rl, serve) one after
# the other
LANES = [["so101", "dagger", "policy", "eval", "sweep", "precision"],
         ["rl", "lerobot_train", "loader", "serve", "convert", "overhead", "packing", "startup", "so101_data",
          "inference"]]


def test_lanes_hold_every_bench_once():
    assert sorted(n for lane in LANES for n in lane) == sorted(BENCHES)


@pytest.fixture(scope="module")
def bench_runs(request, tmp_path_factory) -> Iterator[dict[str, Future]]:
    """Starts every selected bench in its lane; each test waits for its own."""
    selected = {item.callspec.params["name"] for item in request.session.items  # (selected, and not skipped)
                if getattr(item, "originalname", "") == "test_bench_runs_to_its_json_line"
                and hasattr(item, "callspec") and not item.get_closest_marker("skip")}
    runs: dict[str, Future] = {name: Future() for name in selected}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}  # TMPDIR as is: Ray's socket paths must stay short

    def lane(names: list[str]) -> None:
        for name in names:
            if name not in runs:
                continue
            args = [a.replace("{tmp}", str(tmp_path_factory.mktemp(name))) for a in BENCHES[name][0]]
            try:
                runs[name].set_result(subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), *args],
                                                     cwd=ROOT, capture_output=True, text=True, timeout=840, env=env))
            except Exception as e:
                runs[name].set_exception(e)

    threads = [threading.Thread(target=lane, args=(names,), daemon=True) for names in LANES]
    for t in threads:
        t.start()
    yield runs
    for t in threads:
        t.join()


@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, (_, _, m) in BENCHES.items()])
@pytest.mark.timeout(1500)
def test_bench_runs_to_its_json_line(name, bench_runs):
    _, keys, _ = BENCHES[name]
    proc = bench_runs[name].result(timeout=1450)
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert keys <= set(last), f"{name}: its JSON line lacks {sorted(keys - set(last))}: {last}"
