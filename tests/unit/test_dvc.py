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
