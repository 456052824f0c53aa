"""Every benchmark the results page (docs/results.md) lists runs to its JSON line, at the smallest settings.

Last round `bench/eval.py` built a model for a 12-dim state the task no longer had, crashed, and `make
bench` stopped before `bench/overhead.py`; nobody noticed because no test ran a bench. These runs
check that each bench still works end to end and prints the numbers the docs quote (its keys), not
what the numbers are: at these sizes they mean nothing. The page's list and this one must agree.

In `make test` each run is a work unit of its own for a pytest-xdist worker (tests/schedule.py). In one process
the runs start with the session and go on beside the other tests (`tests/e2e/background.py`: one after another
at `nice 5`; a second lane for the Ray benches when the other tests are done); these tests come last and wait for
them. One after another in the foreground they cost CI 11 minutes; in two foreground lanes, 10.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.background import BENCHES, ORDER, RAY, ROOT, last_json

pytestmark = [pytest.mark.slow]


def test_the_results_page_lists_exactly_these_benches():
    page = (ROOT / "docs" / "results.md").read_text()
    listed = set(re.findall(r"bench/(\w+)\.py", page)) - {"record"}  # bench/record.py: what every bench writes with
    assert listed == set(BENCHES), f"docs/results.md lists {sorted(listed)}; smoke-tested: {sorted(BENCHES)}"
    makefile = set(re.findall(r"bench/(\w+)\.py", (ROOT / "Makefile").read_text()))
    assert makefile <= set(BENCHES)


def test_the_runs_hold_every_bench_once():
    assert sorted(ORDER + RAY) == sorted(BENCHES)


@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, (_, _, m) in BENCHES.items()])
@pytest.mark.timeout(2700)
def test_bench_runs_to_its_json_line(name, bench_runs):
    _, keys, _ = BENCHES[name]
    proc = bench_runs.result(name, timeout=2600)
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
    last = last_json(proc.stdout)
    assert keys <= set(last), f"{name}: its JSON line lacks {sorted(keys - set(last))}: {last}"
    written = [line.split("] ", 1)[1] for line in proc.stderr.splitlines() if line.startswith("[record] ")]
    assert len(written) == 1, f"{name}: wrote {len(written)} records"
    record = json.loads(Path(written[0]).read_text())
    assert record["figures"] == last and record["bench"] == name and record["machine"]["cores"] == os.cpu_count()
    assert record["commit"] == subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                              text=True).stdout.strip()
