"""The README's first command, exactly as a new user runs it, on a fresh clone of the committed tree.

Last round every test passed while `make demo` failed on a fresh clone (an ignore rule made
DVC refuse the stage outputs), and the policy it trained solved 23% of its task. This runs
`.ci/fresh-clone-demo`: clone HEAD into a temporary folder, fresh PREFECT_HOME, `make demo` with
its default `demo` preset (install, 512 recorded demonstrations, 1,200 training steps, 48 held-out
evaluation episodes, registration), and requires what the README claims: the summary's policy succeeds on at
least 90% of them (measured on the 2-core AMD EPYC VM: 48/48 in every run since uniform sample order; 44/48 and
45/48 before; float rounding differs between CPUs, so the claim is 90%, not 100%) against a random policy's 10% at
most, and the promotion is the gate's rule applied to the registered numbers.
`roboloop reproduce` is skipped here (it would retrain for 3 more minutes): the closed-loop flow test
reproduces a registered version bit for bit. The install skips precompiling bytecode (`COMPILE_BYTECODE=`: 70 s
of the test's 8 minutes; Python compiles what the demo imports). Uncommitted changes are not in it: that is the point.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.processes import kill_leftovers

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.isaac]


@pytest.mark.timeout(1500)
def test_make_demo_on_a_fresh_clone_trains_a_policy_that_succeeds(tmp_path):
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    # its own session: on a timeout the whole tree (make, the demo, its Prefect server and workers) is killed,
    # so nothing keeps the cores busy for the tests after it
    proc = subprocess.Popen([str(ROOT / ".ci/fresh-clone-demo")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp_path), "ROBOLOOP_DEMO_PRESET": "demo",
                                 "ROBOLOOP_FRESH_CLONE_REPRODUCE": "0", "COMPILE_BYTECODE": ""})
    try:
        out, _ = proc.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("make demo on a fresh clone did not finish in 20 minutes:\n" + out[-6000:])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        kill_leftovers(str(tmp_path))
    tail = out[-6000:]
    assert proc.returncode == 0, tail
    assert "closed loop finished in" in out and "fresh-clone demo: OK" in out, tail
    summary = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert summary["registry_version"] == 1 and summary["success_rate"] >= 0.9, summary
    assert summary["random_success_rate"] <= 0.1 and summary["promoted"] is True, summary  # .ci/fresh-clone-demo
    # checked the decision against the gate's rule
    # the demo ends where a robot begins: the version it registered, served and driven through its server
    served = summary["served"]
    assert served and served["ref"] == "registry:reach-vla@1" and served["episodes"] == 16, summary
    assert served["same_outcomes"] == 16 and served["roundtrip_ms_p50"] > 0, served

