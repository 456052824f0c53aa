"""DVC tracking in a throwaway git+DVC repo with a local remote."""

from __future__ import annotations

import subprocess

from roboloop import dvc


def test_track_returns_md5_and_pushes(small_v21, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    dvc.init_repo(repo)
    import shutil

    shutil.copytree(small_v21, repo / "data")
    tracked = dvc.track(repo / "data")
    assert tracked.md5.endswith(".dir") and tracked.dvc_file == repo / "data.dvc"
    assert dvc.md5_of(repo / "data.dvc") == tracked.md5
    assert tracked.nfiles == sum(1 for p in small_v21.rglob("*") if p.is_file())
    remote = repo / dvc.LOCAL_REMOTE
    assert sum(1 for p in remote.rglob("*") if p.is_file()) >= tracked.nfiles
    # Same content -> same md5; changed content -> new md5.
    assert dvc.track(repo / "data").md5 == tracked.md5
    (repo / "data/meta/tasks.jsonl").write_text('{"task_index": 0, "task": "x"}\n')
    assert dvc.track(repo / "data", push=False).md5 != tracked.md5


def test_stage_outputs_can_be_tracked_under_the_repos_ignore_rules(tmp_path):
    """The committed .gitignore must let DVC write the .dvc files of the loop's outputs (make demo, reproduce)."""
    from pathlib import Path

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text((Path(__file__).resolve().parents[2] / ".gitignore").read_text())
    dvc.init_repo(repo)
    for rel in ("artifacts/dataset_v3", "artifacts/reproduce/reach-vla-v1/dataset_v3"):
        (repo / rel).mkdir(parents=True)
        (repo / rel / "f.bin").write_bytes(b"x")
        tracked = dvc.track(repo / rel, push=False)
        assert tracked.dvc_file == repo / (rel + ".dvc")
    # outputs stay out of git, their .dvc files do not
    ignored = subprocess.run(["git", "check-ignore", "artifacts/dataset_v3/f.bin", "artifacts/dataset_v3.dvc"],
                             cwd=repo, capture_output=True, text=True).stdout.split()
    assert ignored == ["artifacts/dataset_v3/f.bin"]


def test_dir_md5_equals_what_dvc_records(small_v21, tmp_path):
    """Receipts carry DVC's identity even when nothing is tracked."""
    import shutil

    from roboloop.hashing import dir_md5

    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    dvc.init_repo(repo)
    shutil.copytree(small_v21, repo / "data")
    (repo / "data" / ".hidden").write_text("dvc hashes hidden files too")
    assert dir_md5(repo / "data") == dvc.track(repo / "data", push=False).md5


def test_cache_keys_do_not_depend_on_how_a_config_was_read_back():
    from roboloop.cache import cache_key
    from roboloop.datasets.config import ConvertConfig

    fresh = ConvertConfig(progress=False)
    read_back = ConvertConfig.model_validate_json(fresh.model_dump_json())  # 100 -> 100.0
    assert cache_key("convert", "md5", fresh.model_dump()) == cache_key("convert", "md5", read_back.model_dump())
    assert cache_key("convert", "md5", fresh.model_dump()) != cache_key("convert", "md5", {"x": 1})


def test_a_committed_dvc_file_is_left_as_committed_when_the_data_differs(small_v21, tmp_path, caplog):
    """`make demo` in a fresh clone re-recorded data/ and rewrote the committed data.dvc, so every version it
    registered named its commit '-dirty' and `git status` showed a change the user did not make."""
    import shutil

    from roboloop.lineage import git_commit

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    dvc.init_repo(repo)
    shutil.copytree(small_v21, repo / "data")
    first = dvc.track(repo / "data", push=False)
    (repo / ".gitignore").write_text("/data\n.roboloop/\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "data"], check=True)
    committed = (repo / "data.dvc").read_bytes()
    (repo / "data/meta/tasks.jsonl").write_text('{"task_index": 0, "task": "recorded elsewhere"}\n')
    again = dvc.track(repo / "data", push=False)
    assert again.md5 != first.md5 and (repo / "data.dvc").read_bytes() == committed
    assert "left as committed" in caplog.text and first.md5 in caplog.text and again.md5 in caplog.text
    assert not git_commit(repo).endswith("-dirty")
