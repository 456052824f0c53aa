"""The docs site: its reference pages are what the code says now, it builds with warnings as errors (broken links
and anchors included), and the README stays a short entry that points into it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]  # not --quiet: it hides the warnings strict counts
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def test_the_generated_pages_match_the_code(tmp_path):
    subprocess.run([sys.executable, str(DOCS / "generate.py"), str(tmp_path)], check=True, cwd=ROOT)
    for page in [*sorted((tmp_path / "reference").iterdir()), tmp_path / "index.md"]:
        committed = DOCS / page.relative_to(tmp_path)
        assert committed.read_text() == page.read_text(), \
            f"{committed.relative_to(ROOT)} is not what the code says now: run `python docs/generate.py`"


def test_every_command_flag_and_config_field_is_in_the_reference():
    from roboloop.cli import build_parser
    from roboloop.training.config import TrainRecipe

    cli = (DOCS / "reference" / "cli.md").read_text()
    for option in ("--perturb", "--latency", "--nproc-per-node", "--policy-type", "--override", "--prefetch"):
        assert f"`{option}`" in cli, option
    commands = next(a for a in build_parser(None)._actions if hasattr(a, "choices") and a.choices).choices
    assert all(f"## `roboloop {c}`" in cli for c in commands)
    config = (DOCS / "reference" / "config.md").read_text()
    for name, field in TrainRecipe.model_fields.items():
        assert f"| `{name}` |" in config and (field.description or "")[:40].replace("|", "\\|") in config, name


def _build(docs_root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*MKDOCS, "-f", str(docs_root / "mkdocs.yml"), "-d", str(site)], cwd=docs_root, env=ENV,
                          capture_output=True, text=True, timeout=300)


def test_the_site_builds_strictly_and_a_broken_link_fails_it(tmp_path):
    built = _build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
    results = (tmp_path / "site" / "results" / "index.html").read_text()
    assert "<!-- records -->" not in results and "Recorded results" in results
    # a broken link fails the build under the site's own strictness: its `validation` settings on a page that links
    # to a page that does not exist (the site itself is not built twice)
    import yaml

    small = tmp_path / "small"
    (small / "docs").mkdir(parents=True)
    (small / "docs" / "index.md").write_text("# Home\n\nSee [the registry](guides/registry-that-does-not-exist.md).\n")
    (small / "mkdocs.yml").write_text(yaml.safe_dump({"site_name": "t", "validation": _validation()}))
    broken = _build(small, tmp_path / "site2")
    assert broken.returncode != 0 and "registry-that-does-not-exist.md" in broken.stderr, broken.stderr[-2000:]


def _validation() -> dict:
    """mkdocs.yml's `validation` block (the file also holds tags PyYAML's safe loader refuses)."""
    import yaml

    text = (ROOT / "mkdocs.yml").read_text()
    block = re.search(r"^validation:\n(?:[ ].*\n)+", text, re.M)
    assert block, "mkdocs.yml has no validation block"
    return yaml.safe_load(block.group(0))["validation"]


def test_the_readme_is_short_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make demo" in readme and "make test" in readme
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert local and all((ROOT / link).exists() for link in local), [x for x in local if not (ROOT / x).exists()]


@pytest.mark.parametrize("page", sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")))
def test_every_page_is_in_the_navigation(page):
    assert f": {page}" in (ROOT / "mkdocs.yml").read_text()
