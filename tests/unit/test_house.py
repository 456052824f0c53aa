"""Guard the house: no import circle among roboloop's modules (imports inside functions count: they close circles
too), imports that run down its floors (FLOORS) but for the named few (UPWARD), nothing outside roboloop/policies/
branches on a policy family's name (a family states what it can do and the caller asks), and no function in
roboloop/ longer than 60 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "roboloop"
FAMILY_NAMES = {"vla", "lerobot", "act", "diffusion", "vqbet", "smolvla"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in LIB.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The roboloop modules `name` imports anywhere in its file (`from pkg import mod` counts as `pkg.mod`)."""
    def known(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {known(a.name) for a in node.names if a.name.startswith("roboloop")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base.startswith("roboloop"):
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else known(base) for a in node.names}
    return {m for m in found if m and m != name}


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each group of modules that import one another, directly or through others (more than one module)."""
    reach = {m: _reach(graph, m) for m in graph}
    groups = {tuple(sorted({m} | {o for o in reach[m] if m in reach[o]})) for m in graph if m in reach[m]}
    return sorted(list(g) for g in groups if len(g) > 1)


def test_no_import_circle_among_roboloops_modules():
    modules = _modules()
    graph = {name: _imports(name, path, modules) & modules.keys() for name, path in modules.items()}
    assert _circles(graph) == []


def test_the_circle_finder_finds_a_circle_closed_inside_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    modules = _modules()
    assert "roboloop.stages" in _imports("roboloop.loop.sweep", modules["roboloop.loop.sweep"], modules)


def _names_family(node: ast.AST) -> bool:
    text = ast.unparse(node)
    return "family" in text or "policy_type" in text


def test_nothing_outside_policies_compares_a_family_name():
    offenders = []
    for path in LIB.rglob("*.py"):
        if path.is_relative_to(LIB / "policies"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            consts = {c.value for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)}
            if consts & FAMILY_NAMES and any(_names_family(s) for s in sides) or consts & {"vla", "lerobot"}:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == [], "ask the family (policies.can, its capabilities) instead:\n" + "\n".join(offenders)


def test_no_function_in_roboloop_is_longer_than_60_lines():
    long = [f"{p.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p in LIB.rglob("*.py") for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno - n.lineno + 1 > 60]
    assert long == []


# roboloop's rooms (its packages and top-level modules) from the top floor down, as they stand: a room imports rooms
# on lower floors. An import from a room up to a higher floor is one of UPWARD, each with its reason, or this fails.
FLOORS = [["entry"], ["cli"], ["loop"], ["serving"], ["stages"], ["cache"], ["rl", "lineage"],
          ["evaluation", "offline"], ["sim"], ["registry"], ["policies"], ["training"], ["datasets"],
          ["warm", "plots", "s3", "dvc"], ["procs", "fsutil"],
          ["binomial", "hashing", "availability", "errors", "settings", "keys", "receipts"]]
UPWARD = {
    ("evaluation", "serving"): "an evaluation through a policy server (serving.client) or the robot's envelope",
    ("training", "policies"): "a training recipe names a policy family, which the policies' registry resolves",
}


def _rooms_graph() -> dict[str, set[str]]:
    modules = _modules()
    room = {name: name.split(".")[1] if "." in name else "" for name in modules}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        for dep in _imports(name, path, modules) & modules.keys():
            if room[name] and room[dep] and room[dep] != room[name]:
                graph.setdefault(room[name], set()).add(room[dep])
    return graph


def test_imports_run_down_the_floors_but_for_the_named_few():
    floor = {r: i for i, rooms in enumerate(FLOORS) for r in rooms}
    graph = _rooms_graph()
    assert set(graph) | {d for ds in graph.values() for d in ds} <= set(floor), "a new room: give it a floor"
    upward = {(a, b) for a, deps in graph.items() for b in deps if floor[b] < floor[a]}
    assert upward == set(UPWARD), f"up: {sorted(upward - set(UPWARD))}; no longer up: {sorted(set(UPWARD) - upward)}"


def _task_words() -> set[str]:
    from roboloop.sim.registry import _FAMILIES, tasks

    return {*tasks(), *(f.prefix for f in _FAMILIES if f.prefix)}


def _names_a_task(const: object, words: set[str]) -> bool:
    """A string that is a task id or a piece of one ("-SO101-", "Roboloop-", "lerobot:", "-Vision-v0")."""
    return isinstance(const, str) and len(const) >= 4 and (any(c in const for c in "-:/") or const[0].isupper()) \
        and any(const in w for w in words)


def _task_tests(tree: ast.AST, words: set[str]) -> list[ast.AST]:
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith", "index", "find", "count"):
            sides = list(node.args)
        else:
            continue
        if any(_names_a_task(c.value, words) for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)):
            found.append(node)
    return found


def test_nothing_outside_a_tasks_module_compares_a_task_id():
    """A task is what its spec says (roboloop.sim.registry); no room asks which task it holds by its id. Only the
    registry and the task declarations (roboloop/sim/tasks/) may."""
    words = _task_words()
    allowed = (LIB / "sim" / "tasks", LIB / "sim" / "registry.py")
    offenders = [f"{p.relative_to(ROOT)}:{n.lineno}: {ast.unparse(n)}" for p in LIB.rglob("*.py")
                 if not any(p == a or p.is_relative_to(a) for a in allowed)
                 for n in _task_tests(ast.parse(p.read_text()), words)]
    assert offenders == [], "ask the task's spec (roboloop.sim.registry.task(id)) instead:\n" + "\n".join(offenders)


def test_the_task_guard_sees_a_task_test():
    words = _task_words()
    planted = ast.parse('if "-SO101-" in task or cfg.task == "Roboloop-Reach-Red-v0" or t.startswith("lerobot:"):\n'
                        '    pass\nif family == "lerobot" or name == "Push the block": pass')
    assert [ast.unparse(n) for n in _task_tests(planted, words)] == [
        "'-SO101-' in task", "cfg.task == 'Roboloop-Reach-Red-v0'", "t.startswith('lerobot:')"]
