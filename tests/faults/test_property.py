"""Property: for random command lines over a tree of user files, no file outside roboloop's own outputs changes.

Each example copies a template world (a user's home with documents and projects, the user's own
dataset, a registry with two versions), runs a random sequence of `roboloop` commands whose path
arguments are drawn from that world (existing user folders and files, the registry root, the
dataset itself, parents of it, fresh paths, earlier outputs), and after every command checks
that every user file and every registry version file still has its original bytes, and that the
command ended with a known exit code and no unexpected error.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roboloop.cli import main
from tests.faults.conftest import tree_hash, user_tree

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]

TARGETS = ["home", "home/docs", "home/docs/notes.txt", "home/proj", "home/proj/sub", "dataset", "dataset/meta",
           "registry", "registry/reach-vla", "new/a", "new/b", "home/new-c", ".", "out/x", "out/y"]
COMMANDS = ["validate", "convert", "download", "promote", "generate", "train"]


@pytest.fixture(scope="module")
def template(v21_dataset, tiny_model, tmp_path_factory):
    from roboloop.registry import Registry
    from tests.faults.conftest import lineage

    root = tmp_path_factory.mktemp("world")
    user_tree(root / "home" / "docs")
    user_tree(root / "home" / "proj" / "sub")
    shutil.copytree(v21_dataset, root / "dataset")
    reg = Registry(root / "registry")
    for s in (3, 5):
        reg.promote("reach-vla", reg.register("reach-vla", tiny_model, lineage(s)), margin=0.5)
    return root


def _argv(cmd: str, world: Path, target: str, flag: bool, ref: str) -> list[str]:
    p = str(world / target)
    reg = ["--registry", str(world / "registry")]
    if cmd == "validate":
        return ["validate", p]
    if cmd == "convert":
        return ["convert", str(world / "dataset"), p, "--no-progress", "--workers", "1", *(["--overwrite"] * flag)]
    if cmd == "download":
        return ["registry", "download", "reach-vla", ref, "--dst", p, *reg, *(["--overwrite"] * flag)]
    if cmd == "promote":
        return ["registry", "promote", "reach-vla", ref, *reg, *(["--force"] * flag)]
    if cmd == "generate":
        return ["generate", p, "--num-episodes", "2", "--min-length", "4", "--max-length", "5", "--camera",
                "observation.images.top=16x16"]
    return ["train", "--dataset", str(world / "dataset"), "--output-dir", p, "--steps", "2", "--max-tokens", "256",
            "--checkpoint-every-steps", "0", *(["--overwrite"] * flag)]


def _protected(world: Path) -> dict[str, str]:
    out = {}
    for sub in ("home", "dataset", "registry/reach-vla/versions"):
        out |= {f"{sub}/{k}": v for k, v in tree_hash(world / sub).items()}
    return out


step = st.tuples(st.sampled_from(COMMANDS), st.sampled_from(TARGETS), st.booleans(),
                 st.sampled_from(["1", "2", "champion", "challenger", "7"]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=1, max_size=4))
def test_random_command_lines_never_change_user_files(template, steps):
    with tempfile.TemporaryDirectory() as tmp:
        world = Path(tmp) / "w"
        shutil.copytree(template, world, symlinks=True)
        before = _protected(world)
        for cmd, target, flag, ref in steps:
            if cmd == "train" and target.startswith(("dataset", "registry")):
                continue  # reading the dataset while writing into it is refused elsewhere; keep examples fast
            argv = _argv(cmd, world, target, flag, ref)
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                code = main(argv)
            assert code in (0, 1, 2, 3), (argv, code, err.getvalue())
            assert "unexpected" not in err.getvalue(), (argv, err.getvalue())
            now = _protected(world)
            changed = sorted(k for k in before if now.get(k) != before[k])
            assert changed == [], (argv, changed, err.getvalue())
