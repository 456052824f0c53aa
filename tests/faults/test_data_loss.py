"""No roboloop command deletes or overwrites anything it did not create."""

from __future__ import annotations

import json
import shutil

from tests.faults.conftest import assert_no_debris, one_line_error, run_cli, tree_hash, user_tree


def test_download_refuses_a_users_folder(registry, tmp_path):
    mine = user_tree(tmp_path / "mine")
    before = tree_hash(mine)
    r = run_cli("registry", "download", "reach-vla", "champion", "--registry", registry.uri, "--dst", mine)
    one_line_error(r, str(mine), "was not created by roboloop", "--dst")
    assert tree_hash(mine) == before
    r = run_cli("registry", "download", "reach-vla", "champion", "--registry", registry.uri, "--dst", mine,
                "--overwrite")  # not even with --overwrite: only roboloop's own downloads are replaced
    one_line_error(r, "was not created by roboloop")
    assert tree_hash(mine) == before
    assert_no_debris(tmp_path)


def test_download_refuses_the_registry_itself(registry, tmp_path):
    root = tmp_path / "registry"
    before = tree_hash(root)
    for dst in (root, root / "reach-vla"):
        r = run_cli("registry", "download", "reach-vla", "1", "--registry", registry.uri, "--dst", dst)
        one_line_error(r, "inside (or contains) the registry")
    assert tree_hash(root) == before
    assert registry.versions("reach-vla") == [1, 2]


def test_default_destination_is_refused_when_it_is_a_users_folder(registry, tmp_path):
    mine = user_tree(tmp_path / "reach-vla-champion")
    before = tree_hash(mine)
    r = run_cli("registry", "download", "reach-vla", "--registry", registry.uri, cwd=tmp_path)
    one_line_error(r, "reach-vla-champion", "was not created by roboloop")
    assert tree_hash(mine) == before


def test_download_reuses_its_own_and_replaces_it_only_when_asked(registry, tmp_path):
    dst = tmp_path / "dl"
    assert run_cli("registry", "download", "reach-vla", "1", "--registry", registry.uri, "--dst", dst).code == 0
    first = tree_hash(dst)
    assert run_cli("registry", "download", "reach-vla", "1", "--registry", registry.uri, "--dst", dst).code == 0
    assert tree_hash(dst) == first  # the same version, verified: reused
    r = run_cli("registry", "download", "reach-vla", "2", "--registry", registry.uri, "--dst", dst)
    one_line_error(r, "already holds a roboloop model", "--overwrite")
    assert run_cli("registry", "download", "reach-vla", "2", "--registry", registry.uri, "--dst", dst,
                   "--overwrite").code == 0
    aside = list(tmp_path.glob("dl.replaced-*"))
    assert len(aside) == 1 and tree_hash(aside[0]) == first  # moved aside, not deleted
    assert json.loads((dst / "lineage.json").read_text())["eval"]["successes"] == 4


def test_convert_refuses_existing_destinations_and_never_touches_the_source(v21_dataset, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(v21_dataset, src)
    before_src = tree_hash(src)
    mine = user_tree(tmp_path / "mine")
    before_mine = tree_hash(mine)
    one_line_error(run_cli("convert", src, mine), str(mine), "was not created by roboloop")
    one_line_error(run_cli("convert", src, tmp_path), "must be outside the source")  # DST contains SRC
    one_line_error(run_cli("convert", src, src / "out"), "must be outside the source")
    assert tree_hash(src) == before_src and tree_hash(mine) == before_mine
    out = tmp_path / "out"
    assert run_cli("convert", src, out, "--no-progress").code == 0
    before_out = tree_hash(out)
    assert run_cli("convert", src, out).code == 0 and tree_hash(out) == before_out  # the same conversion: reused
    one_line_error(run_cli("convert", src, out, "--max-episodes-per-file", "1"),  # another one: refused
                   "already holds a roboloop dataset_v3", "--overwrite")
    assert tree_hash(src) == before_src and tree_hash(out) == before_out
    assert_no_debris(tmp_path)


def test_training_never_replaces_a_finished_model(v3_dataset, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--dataset", v3_dataset, "--output-dir", out, "--max-tokens", "512", "--checkpoint-every-steps",
            "0"]
    first = run_cli(*args, "--steps", "3")
    assert first.code == 0, first.text[-2000:]
    summary = json.loads(first.out.strip().splitlines()[-1])
    before = tree_hash(out)
    r = run_cli(*args, "--steps", "2")
    one_line_error(r, "holds a finished model of 3 steps", "--overwrite")
    r = run_cli(*args, "--steps", "3", "--lr", "0.01")
    one_line_error(r, "different lr")
    other = tmp_path / "other_v3"
    shutil.copytree(v3_dataset, other)
    info = other / "meta" / "info.json"
    info.write_text(info.read_text().replace('"robot_type"', '"note": 1, "robot_type"'))
    one_line_error(run_cli("train", "--dataset", other, "--output-dir", out, "--steps", "3"), "different dataset")
    assert tree_hash(out) == before
    again = run_cli(*args, "--steps", "3")  # the same run: already finished, valid JSON, nothing rewritten
    assert again.code == 0 and json.loads(again.out.strip().splitlines()[-1])["final_loss"] == summary["final_loss"]
    assert tree_hash(out) == before
    mine = user_tree(tmp_path / "mine")
    before_mine = tree_hash(mine)
    one_line_error(run_cli("train", "--dataset", v3_dataset, "--output-dir", mine, "--steps", "2"), "left untouched")
    assert tree_hash(mine) == before_mine
