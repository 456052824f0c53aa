"""Every benchmark the README lists runs to its JSON line, at the smallest settings.

Last round `bench/eval.py` built a model for a 12-dim state the task no longer had, crashed, and `make
bench` stopped before `bench/overhead.py`; nobody noticed because no test ran a bench. These runs
check that each bench still works end to end and prints the numbers the README quotes (its keys), not
what the numbers are: at these sizes they mean nothing. The README's list and this one must agree.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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
    "so101": (["--episodes", "2", "--num-envs", "2", "--speed-steps", "3"],
              {"env_steps_per_s_cameras", "env_steps_per_s_no_cameras", "expert", "random"}, [pytest.mark.isaac]),
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


@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, (_, _, m) in BENCHES.items()])
@pytest.mark.timeout(900)
def test_bench_runs_to_its_json_line(name, tmp_path):
    args, keys, _ = BENCHES[name]
    cmd = [sys.executable, str(ROOT / "bench" / f"{name}.py"), *[a.replace("{tmp}", str(tmp_path)) for a in args]]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=840,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})  # TMPDIR as is: Ray's socket paths must stay short
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert keys <= set(last), f"{name}: its JSON line lacks {sorted(keys - set(last))}: {last}"
