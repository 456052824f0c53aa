"""Guard the layering: the library never imports Prefect."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_library_does_not_import_prefect():
    offenders = []
    for path in (ROOT / "roboloop").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "prefect"]
    assert offenders == []


def test_files_stay_small():
    big = [p for p in (ROOT / "roboloop").rglob("*.py") if len(p.read_text().splitlines()) > 500]
    assert big == []
