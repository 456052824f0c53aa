"""Bench results as records (bench/record.py): what a record holds, when the Results page calls it stale, and that
the figures on that page come from records only."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_record", ROOT / "bench" / "record.py")
record = importlib.util.module_from_spec(spec)
spec.loader.exec_module(record)
BENCHES = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "record.py")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_a_record_is_current_until_a_commit_changes_what_it_measures():
    first = _git("log", "--reverse", "--format=%H", "--", "roboloop/cli.py").splitlines()[0]
    old = record.make("startup", {"help_s": 0.1}, ["roboloop/cli.py"], [])
    assert old["commit"] == _git("rev-parse", "HEAD") and old["machine"]["cores"] >= 1
    old["dirty"] = False
    assert record.staleness(old) == "current"
    old["commit"] = first  # the file changed in many commits since its first
    assert record.staleness(old).startswith("stale: ")
    old["commit"] = "0" * 40
    assert record.staleness(old).startswith("unknown")
    old["commit"], old["dirty"] = _git("rev-parse", "HEAD"), True
    assert record.staleness(old) == "measured with uncommitted changes"


def test_prose_alone_keeps_a_record_current_and_code_makes_it_stale(tmp_path):
    """A commit that changes only a docstring or a comment of what a bench measures leaves the figures as they were;
    one that changes a line of code does not (the Results page names the file)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    src = tmp_path / "step.py"
    src.write_text('"""Steps."""\n\n\ndef step(x):\n    """One step."""\n    return x + 1\n')
    git("add", "step.py")
    git("commit", "-qm", "first")
    r = {"commit": git("rev-parse", "HEAD"), "measures": ["step.py"], "dirty": False}
    src.write_text('"""Steps, said better."""\n\n\ndef step(x):  # why\n    """One step, said better."""\n'
                   '    return x + 1\n')
    git("commit", "-qam", "prose")
    assert record.staleness(r, tmp_path) == "current"
    src.write_text(src.read_text().replace("x + 1", "x + 2"))
    git("commit", "-qam", "code")
    assert record.staleness(r, tmp_path) == "stale: the code it measures changed since (step.py)"


def test_the_table_shows_each_records_figures_date_commit_and_machine():
    r = record.make("optim", {"ratio": 0.42, "models": [{"x": 1}]}, ["bench/optim.py"], ["--steps", "3"])
    table = record.markdown([r])
    row = table.splitlines()[2]
    assert "`bench/optim.py`" in row and "`--steps 3`" in row and "ratio 0.42" in row and r["date"][:10] in row
    assert r["commit"][:8] in row and f"{r['machine']['cores']} cores" in row and r["machine"]["cpu"] in row


@pytest.mark.parametrize("path", BENCHES, ids=lambda p: p.stem)
def test_every_bench_declares_what_it_measures_and_writes_its_line_as_a_record(path):
    tree = ast.parse(path.read_text())
    measures = [n.value for n in tree.body if isinstance(n, ast.Assign) and
                any(getattr(t, "id", "") == "MEASURES" for t in n.targets)]
    assert len(measures) == 1, f"{path.name} declares no MEASURES"
    paths = ast.literal_eval(measures[0])
    assert f"bench/{path.name}" in paths and all((ROOT / p).exists() for p in paths)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "emit"]
    assert len(calls) == 1, f"{path.name}: its JSON line must go through bench/record.py's emit once"


def test_the_committed_records_are_whole():
    for p in sorted((ROOT / "bench" / "results").glob("*.json")):
        r = json.loads(p.read_text())
        assert set(r) >= {"bench", "argv", "date", "commit", "machine", "measures", "figures"}, p.name
        assert (ROOT / "bench" / f"{r['bench']}.py").exists() and r["figures"], p.name
        assert {"cpu", "cores", "gpu"} <= set(r["machine"]), p.name


def test_the_results_page_quotes_no_figure_of_its_own():
    """Its text explains; every figure on it is rendered from a record (docs/hooks.py fills the marker)."""
    page = (ROOT / "docs" / "results.md").read_text()
    assert "<!-- records -->" in page
    assert not (figures := _figures_in_prose(page)), f"docs/results.md quotes figures without a record: {figures}"


def _figures_in_prose(text: str) -> list[str]:
    """The measured-looking figures in a page's prose: decimals, numbers with a unit of time, size or rate, ratios,
    percentages and counts like 47/48. Code (blocks and spans), record quotes, version numbers and addresses are
    not prose figures; a setting is written as code (`steps 2500`) or in words."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = record.QUOTE.sub("", prose)
    prose = re.sub(r"`[^`]*`", "", prose)
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # link targets
    prose = re.sub(r"\b\d+(?:\.\d+){2,}\b|\b\d+\.\d+\.x\b|https?://\S+", "", prose)  # versions x.y.z, addresses
    prose = re.sub(r"(?i)\b(?:python|isaac ?lab|lerobot|prefect|ray|torch|kubernetes|apache-|v|mujoco|cuda|"
                   r"postgresql|debian|arxiv|h100|h200|nvlink|ndr)[ -]?\d+(?:\.\d+)?(?:, v?\d+(?:\.\d+)?)*"
                   r"(?: and v?\d+(?:\.\d+)?)?", "", prose)
    unit = r"%|ms|s|min|minutes|seconds|hours|h|x|×|MB|GB|MiB|GiB|TB|KB|us|µs|[a-z-]+/s"
    return re.findall(rf"(?<![\w.,])(?:\d+(?:[.,]\d+)?\s?(?:{unit})(?![\w/])|\d+\.\d+|\d+/\d+\b)", prose)


PAGES = sorted([*(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts), ROOT / "README.md"])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_figure_in_the_docs_and_the_readme_comes_from_a_record(page):
    """A measured figure on a page is a quote of a record (the site shows its date, commit and machine and marks it
    when stale); each quote names a record that exists. The reference pages are generated from the code."""
    text = page.read_text()
    assert not (figures := _figures_in_prose(text)), \
        f"{page.relative_to(ROOT)} quotes figures without a record: {figures}"
    records = record.load()
    for m in record.QUOTE.finditer(text):
        record.quoted(m["bench"], [k.strip() for k in m["keys"].split(",")], records, m["args"])
    # a quote broken across two lines is no quote: the site would show its braces
    unquoted = re.sub(r"```.*?```|`[^`\n]*`", "", record.QUOTE.sub("", text), flags=re.S)
    assert "{{" not in unquoted, f"{page.relative_to(ROOT)}: a quote the site cannot read (one line each): " \
        + unquoted[unquoted.index("{{"):][:120]


def test_a_quote_shows_the_newest_record_with_its_provenance_and_a_missing_one_is_refused():
    old = record.make("so101", {"expert": {"success": 0.5, "ci": [0.4, 0.6]}}, ["bench/so101.py"], [])
    new = record.make("so101", {"expert": {"success": 0.96875, "ci": [0.912, 0.989]}}, ["bench/so101.py"], [])
    old["date"], new["date"], new["dirty"] = "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", False
    page = "Expert {{ so101: expert.success, expert.ci.0, expert.ci.1 | {:.1%} [{:.1%}, {:.1%}] }} here."
    shown = record.render_quotes(page, "guides/so101.md", [new, old])
    assert shown.startswith("Expert 96.9% [91.2%, 98.9%] <sup>[so101 · 2026-02-01 · ")
    assert f"{new['commit'][:8]} · {new['machine']['cpu']}, {new['machine']['cores']} cores](../results.md)" in shown
    new["commit"] = _git("log", "--reverse", "--format=%H", "--", "bench/so101.py").splitlines()[0]
    assert ", stale](../results.md)" in record.render_quotes(page, "guides/so101.md", [new, old])
    with pytest.raises(record.QuoteError, match="no record of bench/so101.py has random.success"):
        record.render_quotes("{{ so101: random.success }}", "index.md", [new, old])
    old["argv"] = ["--episodes", "96", "--policy", "act"]
    assert record.render_quotes("{{ so101[--episodes 96 --policy act]: expert.success }}", "i.md", [new, old]) \
        .startswith("0.5 <sup>[so101 · 2026-01-01")
    assert record.render_quotes("{{ so101[~act]: expert.success }}", "i.md", [new, old]).startswith("0.5 <sup>")
    assert record.render_quotes("{{ so101[]: expert.success }}", "i.md", [new, old]).startswith("0.96875 <sup>")
    with pytest.raises(record.QuoteError, match=r"so101.py run with \[~vla\] has expert.success"):
        record.render_quotes("{{ so101[~vla]: expert.success }}", "i.md", [new, old])
