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


HEAVY = ("torch", "pandas", "isaaclab", "prefect", "lerobot", "boto3")


def _heavy_modules_after(argv: list[str]) -> list[str]:
    import subprocess
    import sys

    code = ("import sys, contextlib, io\nfrom roboloop.cli import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main({argv!r})\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return eval(out.stdout.strip().splitlines()[-1])  # a list literal we printed ourselves


def test_help_and_validate_start_without_heavy_imports(small_v21):
    """`roboloop --help` and `roboloop validate` stay fast: no torch, pandas, simulator or Prefect."""
    assert _heavy_modules_after(["--help"]) == []
    assert _heavy_modules_after(["validate", str(small_v21)]) == []
    assert _heavy_modules_after(["validate", "--json", str(small_v21)]) == []


def test_flows_and_tasks_import_without_torch_or_a_simulator():
    import subprocess
    import sys

    # every module in flows/ and tasks/ (found, not listed: a new one is covered), and the loop's library side
    mods = sorted(f"{d}.{p.stem}" for d in ("flows", "tasks") for p in (ROOT / d).glob("*.py") if p.stem != "__init__")
    assert {"flows.sweep", "flows.rl_finetune", "flows.watch", "flows.report"} <= set(mods)
    code = ("import sys, importlib\n"
            f"for m in {[*mods, 'roboloop.stages', 'roboloop.loop', 'roboloop.cli.loop']!r}:\n"
            "    importlib.import_module(m)\n"
            "print(sorted(m for m in ('torch', 'isaaclab', 'warp', 'newton', 'lerobot') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_no_import_cycles_between_validation_and_its_checks_or_registry_and_evaluation():
    def imports(path: Path) -> set[str]:
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
        return out

    lib = ROOT / "roboloop"
    for checker in ("validate_v2.py", "validate_v30.py", "checks.py", "files.py"):
        assert "roboloop.datasets.validate" not in imports(lib / "datasets" / checker), checker
    assert not any(m.startswith("roboloop.registry") for m in imports(lib / "evaluation" / "policies.py")
                   if m != "roboloop.registry")  # only the lazy resolve inside make_policy
    reg_imports = set().union(*(imports(p) for p in (lib / "registry").glob("*.py")))
    assert not any(m.startswith("roboloop.evaluation") for m in reg_imports)
