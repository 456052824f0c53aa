"""A bench's result as a record: the JSON line it prints, also written to `bench/results/` with what it ran on.

A record is one JSON file, `bench/results/<bench>-<UTC time>-<commit>.json`:
{"bench", "argv", "date", "commit", "dirty", "machine": {"cpu", "cores", "memory_gb", "gpu"}, "measures",
"figures"}. `measures` is the code the bench measures (each bench declares it); the docs' Results page is rendered
from the records (docs/hooks.py) and marks one stale when the code at any of those paths changed after it (a
Python file whose docstrings or comments alone changed still runs the same code: that keeps a record current).
A docs page quotes a record's figure as `{{ BENCH: KEY[, KEY...] [| TEMPLATE] }}` (KEY a dotted path into its
figures, list items by index; TEMPLATE a str.format pattern, e.g. `{:.1%} [{:.1%}, {:.1%}]`; KEY `markdown()`: the
bench's own `markdown(figures)`, its tables): the site shows the newest record of BENCH that has those keys, with its
date, commit and machine, marked when it is not current. `BENCH[ARGS]` takes only records run with exactly those
arguments (`policy[--skip-vision]`; `policy[]`: the defaults), `BENCH[~WORD ...]` those whose arguments contain
each WORD.
`ROBOLOOP_BENCH_RESULTS` sends records elsewhere (the test suite's smoke runs write to a temporary folder).
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import os
import platform
import posixpath
import re
import subprocess
import sys
from pathlib import Path

from roboloop.procs import passive_waits

ROOT = Path(__file__).resolve().parents[1]
# benches train and evaluate in their own process as roboloop's children do: OpenMP threads that wait passively
# (every bench imports this module before torch)
passive_waits(os.environ)
RESULTS = ROOT / "bench" / "results"


def _git(*args: str) -> str:
    run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return run.stdout.strip() if run.returncode == 0 else ""


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu() -> str | None:
    torch = sys.modules.get("torch")  # a bench that used the GPU has imported torch; never import it only for this
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return None


def machine() -> dict:
    try:
        memory_gb = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        memory_gb = None
    return {"cpu": _cpu(), "cores": os.cpu_count(), "memory_gb": memory_gb, "gpu": _gpu()}


def make(bench: str, figures: dict, measures: list[str], argv: list[str]) -> dict:
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--", *measures)) if commit else None
    return {"bench": bench, "argv": argv, "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": commit or None, "dirty": dirty, "machine": machine(), "measures": measures, "figures": figures}


def emit(figures: dict, measures: list[str]) -> Path:
    """Print the bench's JSON line (its last line of stdout, as before) and write its record; return its path."""
    print(json.dumps(figures), flush=True)
    bench = Path(sys.argv[0]).stem
    missing = [m for m in measures if not (ROOT / m).exists()]
    if missing or not measures:
        raise ValueError(f"bench {bench} declares paths it measures that do not exist: {missing or 'none given'}")
    record = make(bench, figures, measures, sys.argv[1:])
    out = Path(os.environ.get("ROBOLOOP_BENCH_RESULTS") or RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    stamp = record["date"].replace("-", "").replace(":", "")
    path = out / f"{bench}-{stamp}-{(record['commit'] or 'nogit')[:8]}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
    print(f"[record] {path}", file=sys.stderr)
    return path


def load(folder: Path = RESULTS) -> list[dict]:
    """Every record in `folder`, newest first."""
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return sorted(records, key=lambda r: r["date"], reverse=True)


def staleness(record: dict, root: Path = ROOT) -> str:
    """'current', or why the record no longer describes the code: what it measures changed since its commit."""
    commit = record.get("commit")
    if not commit:
        return "unknown: measured outside a git checkout"
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root, capture_output=True)
    if known.returncode != 0:
        return f"unknown: commit {commit[:8]} is not in this history"
    files = subprocess.run(["git", "diff", "--name-only", commit, "HEAD", "--", *record["measures"]], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    if changed := [f for f in files if _code_at(root, commit, f) != _code_at(root, "HEAD", f)]:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        return f"stale: the code it measures changed since ({', '.join(changed[:3])}{more})"
    return "measured with uncommitted changes" if record.get("dirty") else "current"


def _code_at(root: Path, rev: str, path: str) -> str | None:
    """The file at `rev` (None: absent); a Python file as its syntax tree without docstrings (comments are not in
    it either)."""
    got = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, text=True)
    if got.returncode != 0:
        return None
    if not path.endswith(".py"):
        return got.stdout
    try:
        tree = ast.parse(got.stdout)
    except SyntaxError:
        return got.stdout
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _leaves(value, key: str = ""):
    """(dotted key, number) for every number in a record's figures, nested ones included, in their order."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield key, value


def _figures(figures: dict, limit: int = 12) -> str:
    shown = [f"{k} {v}" for k, v in _leaves(figures)]
    more = f" (+{len(shown) - limit} more in the record)" if len(shown) > limit else ""
    return ", ".join(shown[:limit]) + more or "(none numeric: see the record)"


def markdown(records: list[dict], root: Path = ROOT) -> str:
    """The Results page's table: each record with its figures, date, commit, machine and whether it is current."""
    rows = ["| bench | arguments | figures | date | commit | machine | status |", "|---|---|---|---|---|---|---|"]
    for r in records:
        m = r["machine"]
        machine = f"{m['cpu']}, {m['cores']} cores" + (f", {m['gpu']}" if m.get("gpu") else "")
        args = " ".join(r["argv"]) or "(defaults)"
        rows.append(f"| `bench/{r['bench']}.py` | `{args}` | {_figures(r['figures'])} | {r['date'][:10]} | "
                    f"`{(r['commit'] or 'none')[:8]}` | {machine} | {staleness(r, root)} |")
    return "\n".join(rows) if records else "No records yet: run a bench (each writes one into `bench/results/`)."


QUOTE = re.compile(r"\{\{ (?P<bench>[a-z0-9_]+)(?:\[(?P<args>[^\]]*)\])?: "
                   r"(?P<keys>[^|]+?)(?: \| (?P<template>.+?))? \}\}")


class QuoteError(ValueError):
    """A docs page quotes a figure that no record holds."""


def _value(figures: dict, key: str):
    value = figures
    for part in key.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def _bench_markdown(bench: str):
    """bench/<bench>.py's `markdown(figures)` (imported with bench/ on the path, as the script runs)."""
    import importlib.util

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{bench}", ROOT / "bench" / f"{bench}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module.markdown


def _ran_with(record: dict, args: str | None) -> bool:
    if args is None:
        return True
    joined = " ".join(record["argv"])
    if args.startswith("~"):
        return all(word in joined for word in args[1:].split())
    return joined == args


def quoted(bench: str, keys: list[str], records: list[dict], args: str | None = None) -> tuple[dict, list]:
    """The newest record of `bench` (run with `args`, see the module's docstring) that has every key, and their
    values."""
    for r in records:
        if r["bench"] != bench or not _ran_with(r, args):
            continue
        if keys == ["markdown()"]:
            return r, [_bench_markdown(bench)(r["figures"])]
        try:
            return r, [_value(r["figures"], k) for k in keys]
        except (KeyError, IndexError, TypeError, ValueError):
            continue
    ran = "" if args is None else f" run with [{args}]"
    raise QuoteError(f"no record of bench/{bench}.py{ran} has {', '.join(keys)}: run the bench (bench/results/)")


def render_quotes(text: str, page: str, records: list[dict], root: Path = ROOT) -> str:
    """`text` (the Markdown of docs page `page`, a path under docs/) with each quote replaced by its figure and a
    mark linking to the Results page: bench, date, commit, machine, and the status when it is not current."""
    link = posixpath.relpath("results.md", posixpath.dirname(page) or ".")
    status: dict[str, str] = {}

    def one(m: re.Match) -> str:
        keys = [k.strip() for k in m["keys"].split(",")]
        r, values = quoted(m["bench"], keys, records, m["args"])
        template = m["template"] or ", ".join("{}" for _ in keys)
        key = f"{r['bench']}{r['date']}"
        status.setdefault(key, staleness(r, root))
        mc = r["machine"]
        machine = f"{mc['cpu']}, {mc['cores']} cores" + (f", {mc['gpu']}" if mc.get("gpu") else "")
        state = "" if status[key] == "current" else f", {status[key].split(':')[0]}"
        mark = f"{r['bench']} · {r['date'][:10]} · {(r['commit'] or 'no commit')[:8]} · {machine}{state}"
        sep = "\n\n" if keys == ["markdown()"] else " "
        return f"{template.format(*values)}{sep}<sup>[{mark}]({link})</sup>"

    return QUOTE.sub(one, text)
