"""Shipped USD assets are exactly what the authoring code writes; the v2.1 episode writer is atomic."""

from __future__ import annotations

import numpy as np
import pytest

from roboloop.sim import assets


def test_shipped_assets_match_authoring_code(tmp_path):
    pytest.importorskip("pxr")
    fresh = assets.write_all(tmp_path)
    shipped = assets.hashes(assets.REPO_ASSETS)
    assert fresh == shipped, "assets/ is stale: run python -m roboloop.sim.assets"


def test_arm_usd_has_what_newton_needs(tmp_path):
    pxr = pytest.importorskip("pxr")
    path = assets.author_arm(tmp_path / "arm.usda")
    stage = pxr.Usd.Stage.Open(str(path))
    links = [p for p in stage.Traverse() if p.HasAPI(pxr.UsdPhysics.RigidBodyAPI)]
    assert [p.GetName() for p in links] == ["base", "link1", "link2"]
    assert all(p.HasAPI(pxr.UsdPhysics.MassAPI) for p in links)
    assert stage.GetPrimAtPath("/ReachArm/base").HasAPI(pxr.UsdPhysics.ArticulationRootAPI)
    joints = [p.GetName() for p in stage.Traverse() if p.IsA(pxr.UsdPhysics.RevoluteJoint)]
    assert joints == list(assets.JOINTS)


def test_episode_writer_is_atomic_and_valid(tmp_path):
    from roboloop.datasets.validate import validate
    from roboloop.datasets.writer import EpisodeWriterV21

    dst = tmp_path / "rec"
    with pytest.raises(RuntimeError), EpisodeWriterV21(dst, 10, ["a", "b"], ["x"], {"cam": (16, 16)}) as w:
        w.add_episode(np.zeros((5, 2)), np.zeros((5, 1)), {"cam": np.zeros((5, 16, 16, 3), np.uint8)}, "t")
        raise RuntimeError("interrupted")
    assert not dst.exists() and list(tmp_path.iterdir()) == []
    w = EpisodeWriterV21(dst, 10, ["a", "b"], ["x"], {"cam": (16, 16)})
    rng = np.random.default_rng(0)
    for n in (5, 9):
        w.add_episode(rng.normal(size=(n, 2)), rng.normal(size=(n, 1)),
                      {"cam": rng.integers(0, 255, (n, 16, 16, 3), dtype=np.uint8)}, f"task {n}")
    with pytest.raises(ValueError, match="same non-zero length"):
        w.add_episode(np.zeros((3, 2)), np.zeros((2, 1)), {"cam": np.zeros((3, 16, 16, 3), np.uint8)}, "bad")
    report = validate(w.close())
    assert report.ok, report.human()
