"""Cache keys change with everything that shapes an output, not only the library's Python.

A cached evaluation must not survive a changed task asset, a changed Prefect task or flow, or a new pin:
each of them is edited here in a scratch copy of the repository's layout, and the key must move.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from roboloop import lineage
from roboloop.cache import cache_key

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    for d, name in (("roboloop", "a.py"), ("tasks", "t.py"), ("flows", "f.py"), ("constraints", "py312.txt")):
        (tmp_path / d).mkdir()
        (tmp_path / d / name).write_text("x = 1\n")
    shutil.copytree(REPO / "assets", tmp_path / "assets")
    monkeypatch.setattr(lineage, "REPO", tmp_path)
    monkeypatch.setattr(lineage, "PINS", tmp_path / "constraints")
    monkeypatch.setenv("ISAACSIM_ASSET_ROOT", str(tmp_path / "assets"))
    return tmp_path


@pytest.mark.parametrize("rel", ["roboloop/a.py", "tasks/t.py", "flows/f.py", "constraints/py312.txt",
                                 "assets/Isaac/IsaacLab/Robots/Roboloop/ReachArm/reach_arm.usda"])
def test_a_change_to_what_shapes_an_output_changes_every_key(scratch, rel):
    before = cache_key("evaluate", "weights", {"task": "Roboloop-Reach-Color-v0"})
    assert cache_key("evaluate", "weights", {"task": "Roboloop-Reach-Color-v0"}) == before  # stable
    with open(scratch / rel, "a") as f:
        f.write("\n# edited\n")
    assert cache_key("evaluate", "weights", {"task": "Roboloop-Reach-Color-v0"}) != before, rel


def test_the_shipped_assets_are_hashed_by_content(monkeypatch):
    monkeypatch.delenv("ISAACSIM_ASSET_ROOT", raising=False)
    first = lineage.code_version()
    asset = REPO / "assets/Isaac/IsaacLab/Robots/Roboloop/ReachArm/reach_arm.usda"
    st = asset.stat()
    import os

    os.utime(asset, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched, same bytes: same key
    try:
        assert lineage.code_version() == first
    finally:
        os.utime(asset, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_every_field_of_a_keyed_config_is_declared_keyed_or_not():
    """A new field must say whether it shapes the output (KEYED) or not (NOT_KEYED), on the model itself."""
    from roboloop.datasets.config import ConvertConfig
    from roboloop.evaluation.config import CollectConfig, EvalRecipe, OfflineRecipe
    from roboloop.keys import keyed, undeclared
    from roboloop.rl.config import RLRecipe
    from roboloop.training.config import TrainRecipe

    for cls in (ConvertConfig, TrainRecipe, RLRecipe, EvalRecipe, OfflineRecipe, CollectConfig):
        assert undeclared(cls) == [], f"{cls.__name__}: classify {undeclared(cls)} in KEYED or NOT_KEYED"
    fast, slow = TrainRecipe(num_workers=1, resume=False), TrainRecipe(num_workers=4)
    assert keyed(fast) == keyed(slow) and keyed(TrainRecipe(lr=1e-2)) != keyed(slow)

    class Grown(TrainRecipe):  # what the test catches: a field nobody classified
        new_knob: int = 0

    assert undeclared(Grown) == ["new_knob"]


def test_a_model_folder_acts_the_same_until_a_file_that_decides_how_it_acts_changes(tmp_path):
    from roboloop.hashing import acting_digest

    for name, text in (("model.safetensors", "w"), ("config.json", '{"model": {"inference_steps": 4}}'),
                       ("stats.json", "{}"), ("metrics.jsonl", "")):
        (tmp_path / name).write_text(text)
    (tmp_path / "checkpoints").mkdir()
    before = acting_digest(tmp_path)
    for name, text in (("heartbeat.json", "{}"), ("metrics.jsonl", "{}\n"), ("loss.png", "png"),
                       ("checkpoints/step1.pt", "x"), ("model.safetensors", "w2")):  # the weights: keyed apart
        (tmp_path / name).write_text(text)
    assert acting_digest(tmp_path) == before
    for name, text in (("config.json", '{"model": {"inference_steps": 8}}'), ("stats.json", '{"a": 1}'),
                       ("policy_preprocessor.json", "{}")):
        (tmp_path / name).write_text(text)
        assert acting_digest(tmp_path) != before, name
        before = acting_digest(tmp_path)
