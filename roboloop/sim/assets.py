"""USD assets the suite ships, authored with `pxr` (usd-exchange); no NVIDIA asset server needed.

`assets/` at the repository root mirrors the layout Isaac Lab expects under
`ISAACSIM_ASSET_ROOT` (`Isaac/IsaacLab/...`), so tasks resolve their USD paths the same way on
a laptop (our folder) and on a cluster (NVIDIA's server, or a mirror of it).

The reach arm: a fixed base and two links turning about vertical axes (a planar SCARA-style
arm), masses and inertias authored on every link (MassAPI), no colliders (nothing to touch),
an ArticulationRootAPI on the base (the task fixes the root with `fix_root_link`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

REPO_ASSETS = Path(__file__).resolve().parents[2] / "assets"
ARM_REL = "Isaac/IsaacLab/Robots/Roboloop/ReachArm/reach_arm.usda"
LINK1, LINK2, BASE_HEIGHT = 0.30, 0.25, 0.05  # metres
JOINTS = ("shoulder", "elbow")


def asset_root() -> Path:
    """Folder Isaac Lab resolves assets under: $ISAACSIM_ASSET_ROOT or the repository's `assets/`."""
    return Path(os.environ.get("ISAACSIM_ASSET_ROOT") or REPO_ASSETS)


def use_shipped_assets() -> Path:
    """Point Isaac Lab at the shipped assets unless the user chose another root. Call before
    importing isaaclab (it reads the variable at import)."""
    os.environ.setdefault("ISAACSIM_ASSET_ROOT", str(REPO_ASSETS))
    return asset_root()


def author_arm(path: Path) -> Path:
    from pxr import Gf, Usd, UsdGeom, UsdPhysics

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.usda")
    stage = Usd.Stage.CreateNew(str(tmp))
    UsdGeom.SetStageUpAxis(stage, UsdGeom.Tokens.z)
    UsdGeom.SetStageMetersPerUnit(stage, 1.0)
    UsdPhysics.SetStageKilogramsPerUnit(stage, 1.0)
    root = UsdGeom.Xform.Define(stage, "/ReachArm")
    stage.SetDefaultPrim(root.GetPrim())

    def link(name: str, pos: tuple[float, float, float], size: tuple[float, float, float], mass: float,
             color: tuple[float, float, float]) -> Usd.Prim:
        xf = UsdGeom.Xform.Define(stage, f"/ReachArm/{name}")
        xf.AddTranslateOp().Set(Gf.Vec3d(*pos))
        prim = xf.GetPrim()
        UsdPhysics.RigidBodyAPI.Apply(prim)
        m = UsdPhysics.MassAPI.Apply(prim)
        m.CreateMassAttr(mass)
        sx, sy, sz = size
        m.CreateDiagonalInertiaAttr(Gf.Vec3f(mass * (sy * sy + sz * sz) / 12, mass * (sx * sx + sz * sz) / 12,
                                             mass * (sx * sx + sy * sy) / 12))
        m.CreateCenterOfMassAttr(Gf.Vec3f(0, 0, 0))
        cube = UsdGeom.Cube.Define(stage, f"/ReachArm/{name}/visual")
        cube.CreateSizeAttr(1.0)
        cube.AddScaleOp().Set(Gf.Vec3f(*size))
        cube.CreateDisplayColorAttr([Gf.Vec3f(*color)])
        return prim

    base = link("base", (0, 0, BASE_HEIGHT / 2), (0.08, 0.08, BASE_HEIGHT), 2.0, (0.2, 0.2, 0.2))
    UsdPhysics.ArticulationRootAPI.Apply(base)
    l1 = link("link1", (LINK1 / 2, 0, BASE_HEIGHT + 0.02), (LINK1, 0.04, 0.03), 0.5, (0.75, 0.75, 0.75))
    l2 = link("link2", (LINK1 + LINK2 / 2, 0, BASE_HEIGHT + 0.05), (LINK2, 0.03, 0.03), 0.3, (0.95, 0.95, 0.95))

    def revolute(name: str, parent: Usd.Prim, child: Usd.Prim, pos0: tuple, pos1: tuple) -> None:
        j = UsdPhysics.RevoluteJoint.Define(stage, f"/ReachArm/{child.GetName()}/{name}")
        j.CreateAxisAttr("Z")
        j.CreateBody0Rel().SetTargets([parent.GetPath()])
        j.CreateBody1Rel().SetTargets([child.GetPath()])
        j.CreateLocalPos0Attr(Gf.Vec3f(*pos0))
        j.CreateLocalPos1Attr(Gf.Vec3f(*pos1))
        j.CreateLocalRot0Attr(Gf.Quatf(1, 0, 0, 0))
        j.CreateLocalRot1Attr(Gf.Quatf(1, 0, 0, 0))
        j.CreateLowerLimitAttr(-170.0)
        j.CreateUpperLimitAttr(170.0)

    revolute(JOINTS[0], base, l1, (0, 0, 0.02 + BASE_HEIGHT / 2 - 0.0), (-LINK1 / 2, 0, 0))
    revolute(JOINTS[1], l1, l2, (LINK1 / 2, 0, 0.03), (-LINK2 / 2, 0, 0))
    stage.GetRootLayer().Save()
    stage = None  # release the layer before renaming it
    tmp.replace(path)
    return path


def write_all(root: Path = REPO_ASSETS) -> dict[str, str]:
    """Author every shipped asset under `root`; returns {relative path: sha256}."""
    author_arm(root / ARM_REL)
    return hashes(root)


def hashes(root: Path | None = None) -> dict[str, str]:
    root = root or asset_root()
    out = {}
    for p in sorted(root.rglob("*.usd*")):
        out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    return out


if __name__ == "__main__":
    print(write_all())
