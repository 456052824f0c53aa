"""Policy families: the one seam between roboloop's machinery and a kind of model.

Training, simulator and offline evaluation, the registry, lineage and serving never ask which model
they hold: they ask a family. roboloop's GR00T-style VLA (`roboloop.policies.vla`) is the first;
a family is chosen by `TrainRecipe.family` (a built-in name, an installed package's entry point, or
`package.module:Class` for one of your own that ROBOLOOP_POLICY_FAMILIES allows: `roboloop.policies.trust`)
and recorded in every model folder it writes (`policy.json`), so a folder is loaded back by the family that
made it, in any process (a folder names a family; it never chooses code to import).

Adding a family (LeRobot's ACT, a linear baseline, ...) is implementing these methods; nothing
outside the family's module changes. `tests/isaac/test_policy_family.py` is a complete example.

    class MyFamily:                                   # implements PolicyFamily
        name = "mine"
        capabilities = frozenset()                    # e.g. {"rl"} if `roboloop rl` can fine-tune it

        def build(self, cfg, features) -> Trainable   # the trainable model for a TrainConfig and a dataset
        def load_init(self, trainable, folder, keys)  # continue from a model folder (DAgger, fine-tuning);
                                                      # returns the stats to keep normalising with
        def write_meta(self, out, trainable, info, data)  # the family's own files (the trainer writes
                                                      # policy.json, stats.json, then the weights last)
        def weights(self, state_dict) -> dict         # optional: the trained module's weights as the folder
                                                      # names them (default: as they are)
        def load(self, folder, device, seed, inference_steps) -> Policy   # act with a model folder

    class MyTrainable:                                # implements Trainable
        module: nn.Module                             # what the optimizer, DDP/FSDP, FP8 and checkpoints see
        needs: DataNeeds                              # what the loader must give it
        def loss_inputs(self, batch, keys, step, denominator) -> tuple   # module(*inputs) is the loss
        def flops(self, batch) -> float | None        # training FLOPs of one batch (MFU), None if unknown
        def extra_metrics(self) -> dict               # more metrics.jsonl fields (e.g. an auxiliary loss)
        def kernels(self, device_type, dtype) -> dict # optional: kernels chosen and why (recorded with the run)
        one_rank_only: str | None                     # optional: why it cannot train on several ranks
        kind: str                                     # optional: the model kind compile=auto's measurements name
                                                      # (module.compile_regions() or its `blocks`: what compiles)

    class MyPolicy:                                   # implements Policy (what `load` returns)
        name, state_dim, action_dim, horizon, state_key, action_key, camera_keys, image_size, stats
        def act(self, obs: Obs) -> Tensor             # (N, H, A) action chunk in the environment's units

Batches are roboloop's `PackedBatch` (normalised state, action chunk and its mask, each camera
resized to `needs.image_size`, instruction tokens); normalisation uses the dataset's stats (mean/std),
which the trainer stores in the folder's `stats.json`.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from roboloop.policies.obs import Obs
    from roboloop.training.packing import PackedBatch

POLICY_FILE = "policy.json"  # roboloop's metadata in every model folder, whatever the family
WEIGHTS_FILE = "model.safetensors"  # written last: its presence means finished; its sha256 is the identity
BUILTIN = {"vla": "roboloop.policies.vla:VLAFamily", "lerobot": "roboloop.policies.lerobot:LeRobotFamily"}


class UnknownFamilyError(ValueError):
    pass


# What each built-in family does not read, field -> why. `TrainRecipe` refuses such a field set to anything but its
# default, and leaves it out of cache keys (no value of it can change what trains). A family of your own may say
# the same as a class attribute `unread_settings` (checked when it trains).
UNREAD_SETTINGS: dict[str, dict[str, str]] = {
    "vla": {
        "policy_type": "it names one of LeRobot's policies (family lerobot); family vla is roboloop's VLA",
        "policy_config": "it holds options of LeRobot's policy configs (family lerobot); family vla's are preset "
                         "and model_overrides",
        "env_state_input": "family vla does not read observation.environment_state as an input (its aux_target "
                           "learns it); LeRobot's policies do",
    },
    "lerobot": {
        "preset": "it sizes family vla's model; a LeRobot policy's size is in policy_config (e.g. dim_model)",
        "aux_target": "the auxiliary target is family vla's image encoder's; LeRobot's policies have no such head",
        "aux_weight": "the auxiliary target is family vla's image encoder's; LeRobot's policies have no such head",
        "max_tokens": "LeRobot's policies pack no backbone tokens: a batch is max_samples samples",
        "image_shift": "family lerobot does not read it (LeRobot's diffusion has crop_shape in policy_config)",
    },
}


def unread_settings(recipe: Any) -> dict[str, str]:
    """Fields of a TrainRecipe that nothing reads for its family and its other settings, and why."""
    out = dict(UNREAD_SETTINGS.get(recipe.family, {}))
    if recipe.family == "lerobot":
        extra = sorted(set(recipe.model_overrides) - ({"horizon"} if recipe.policy_type == "act" else set()))
        if extra or recipe.policy_type != "act":
            out["model_overrides"] = ("family lerobot reads only model_overrides.horizon, and only for act (the "
                                      "chunk size); " + (f"{', '.join(extra)}: " if extra else "")
                                      + "LeRobot's options belong in policy_config")
    if recipe.family == "vla" and not recipe.with_video:
        out.setdefault("aux_target", "family vla's image encoder predicts the auxiliary target, and this recipe "
                                     "feeds no images (with_video false)")
        out.setdefault("image_shift", "it shifts family vla's training images; this recipe has no images (with_video "
                                      "false)")
    if not recipe.aux_target:
        out.setdefault("aux_weight", "it weighs the auxiliary target's loss, and the recipe has no aux_target")
    if recipe.family == "vla":
        out.setdefault("finetune", "family vla trains from scratch here: it has no pretrained backbone to freeze and "
                                   "no LoRA targets (init_from continues a model whole)")
    if getattr(recipe, "finetune", "full") != "lora":
        for name in ("lora_rank", "lora_alpha", "lora_targets"):
            out.setdefault(name, f"it shapes LoRA's adapters, and finetune is {getattr(recipe, 'finetune', 'full')}")
    return out


@dataclass(frozen=True)
class Features:
    """What a dataset offers a family to build from."""

    state_key: str
    action_key: str
    state_dim: int
    action_dim: int
    cameras: tuple[dict, ...]  # each camera's description (key, kind, storage, height, width)
    fps: float
    aux_dim: int = 0  # size of the recipe's auxiliary target (0: none)
    stats: dict = field(default_factory=dict)  # the dataset's stats per feature ({key: {"mean": ..., ...}})
    env_state_dim: int = 0  # observation.environment_state's size where the loader offers it as an input (0: none)


@dataclass(frozen=True)
class DataNeeds:
    """What a trainable reads from the data: the loader is built from this."""

    horizon: int  # action chunk length
    cameras: bool = True  # decode camera frames (False: state + language only)
    image_size: tuple[int, int] | None = (64, 64)  # (H, W) every camera is resized to; None: each as stored
    camera_keys: tuple[str, ...] | None = None  # the cameras it reads (None: every one the dataset has)
    normalized: bool = True  # state and actions normalised by the loader (False: raw; the family normalises)
    history: int = 1  # observation frames per sample (> 1: states (N, n, S), images (3n, H, W), chunk from t-n+1)
    drop_last: int = 0  # frames at each episode's end never drawn as samples (LeRobot's drop_n_last_frames)
    env_state: bool = False  # reads observation.environment_state (raw; with history (N, n, E), oldest first)
    tokens_per_image: int = 0  # the packer's token budget per image
    token_budget: bool = True  # False: the model packs no backbone tokens; a batch is max_samples (max_tokens unused)
    state_tokens: int = 1
    max_text_len: int = 96
    tokenizer: str | None = None  # local Hugging Face tokenizer folder; None: byte tokens


@runtime_checkable
class Policy(Protocol):
    """`history` (optional attribute, default 1): observation frames `act` needs; the Evaluator then gives each
    observation its `past` frames (oldest first, the episode's first frame repeated at its start).
    `env_state_dim` (optional, default 0): the size of the observation.environment_state it reads (`Obs.env_state`);
    the Evaluator then asks roboloop's tasks for their scene state."""

    name: str
    state_dim: int
    action_dim: int
    horizon: int
    state_key: str
    action_key: str
    camera_keys: list[str]
    image_size: tuple[int, int]
    stats: dict

    def act(self, obs: Obs) -> torch.Tensor: ...


@runtime_checkable
class Trainable(Protocol):
    module: Any
    needs: DataNeeds

    def loss_inputs(self, batch: PackedBatch, keys: list[int], step: int, denominator: float) -> tuple: ...

    def flops(self, batch: PackedBatch) -> float | None: ...

    def extra_metrics(self) -> dict: ...


@runtime_checkable
class PolicyFamily(Protocol):
    name: str
    capabilities: frozenset[str]

    def build(self, cfg: Any, features: Features) -> Trainable: ...

    def load_init(self, trainable: Trainable, folder: Path, keys: list[str]) -> dict: ...

    def write_meta(self, out: Path, trainable: Trainable, info: ModelInfo, data: dict) -> None: ...

    def load(self, folder: Path, device: str = "cpu", seed: int = 0, inference_steps: int | None = None) -> Policy: ...


_FAMILIES: dict[str, PolicyFamily] = {}


def family(name: str) -> PolicyFamily:
    """The family called `name`: a built-in (`vla`, `lerobot`), one an installed package offers (entry point group
    `roboloop.policy_families`), or `package.module:Class` that the operator allows (ROBOLOOP_POLICY_FAMILIES).
    A name from anywhere else, a model folder's policy.json above all, is refused before anything is imported."""
    path = BUILTIN.get(name) or _allowed_path(name)  # checked at every call: the allow-list can change
    if name not in _FAMILIES:
        mod, _, cls = path.partition(":")
        try:
            obj = getattr(importlib.import_module(mod), cls)()
        except (ImportError, AttributeError) as e:
            raise UnknownFamilyError(f"policy family {name!r} cannot be loaded ({e})") from e
        missing = [m for m in ("build", "load_init", "write_meta", "load") if not callable(getattr(obj, m, None))]
        if missing:
            raise UnknownFamilyError(f"policy family {name!r} lacks {', '.join(missing)}")
        _FAMILIES[name] = obj
    return _FAMILIES[name]


def _allowed_path(name: str) -> str:
    from roboloop.policies.trust import allowed_families, installed_families

    installed = installed_families()
    if name in installed:
        return installed[name]
    if ":" not in name:
        raise UnknownFamilyError(f"unknown policy family {name!r}: use one of {sorted({*BUILTIN, *installed})} "
                                 "or an allowed 'package.module:Class' of a PolicyFamily")
    if name not in allowed_families():
        raise UnknownFamilyError(
            f"policy family {name!r} is not allowed: families come from roboloop ({sorted(BUILTIN)}), from "
            "installed packages (entry points 'roboloop.policy_families'), or from the operator's "
            "ROBOLOOP_POLICY_FAMILIES (comma-separated 'package.module:Class'); a recipe or a model folder naming "
            "code does not import it")
    return name


@dataclass
class ModelInfo:
    """roboloop's metadata of a model folder, whatever its family (policy.json)."""

    family: str
    state_key: str
    action_key: str
    state_dim: int
    action_dim: int
    horizon: int
    camera_keys: list[str] = field(default_factory=list)
    cameras: list[dict] = field(default_factory=list)  # each camera's description (+ depth_mm for depth)
    train: dict = field(default_factory=dict)  # the TrainConfig it was trained with (empty: unknown)
    split: dict = field(default_factory=dict)  # {"train_episodes": [...], "validation_episodes": [...]}
    notes: list[str] = field(default_factory=list)  # what is not known about it (imported folders)
    checkpoint_step: int | None = None  # set when the folder was exported from a run's checkpoint
    runtime: dict = field(default_factory=dict)  # what ran: precision, FP8 linears, attention, device, versions

    def to_json(self) -> dict:
        return dict(vars(self))


def model_info(folder: str | Path) -> ModelInfo:
    """The folder's `policy.json`, or (folders written before families existed) its VLA config.json."""
    from roboloop.errors import CorruptFileError

    folder = Path(folder)
    for name in (POLICY_FILE, "config.json"):
        f = folder / name
        if not f.is_file():
            continue
        try:
            d = json.loads(f.read_text())
        except ValueError as e:
            raise CorruptFileError(f"{f} is not valid JSON ({e})") from e
        if name == POLICY_FILE:
            known = ModelInfo.__dataclass_fields__
            return ModelInfo(**{k: v for k, v in d.items() if k in known})
        if "type" in d and "input_features" in d:  # a LeRobot policy folder (lerobot-train's pretrained_model)
            ins, outs = d.get("input_features") or {}, d.get("output_features") or {}
            state = next((k for k, f in ins.items() if f.get("type") == "STATE"), "observation.state")
            action = next(iter(outs), "action")
            train, notes = {"policy_type": d["type"]}, ["not trained by roboloop: no held-out split is known"]
            tc = folder / "train_config.json"  # what lerobot-train writes beside it
            if tc.is_file():
                t = json.loads(tc.read_text())
                root = (t.get("dataset") or {}).get("root")
                train |= {"trained_by": "lerobot-train", "seed": t.get("seed", 0), "steps": t.get("steps"),
                          "batch_size": t.get("batch_size"), "lerobot_repo_id": (t.get("dataset") or {}).get("repo_id")}
                if root and Path(root).is_absolute():
                    train["dataset"] = root
                elif root:
                    notes.append(f"its dataset root {root!r} is relative to wherever lerobot-train ran: name the "
                                 "dataset with --dataset")
            else:
                notes.append("its training config and dataset are unknown (no train_config.json)")
            return ModelInfo("lerobot", state, action, int((ins.get(state) or {"shape": [0]})["shape"][-1]),
                             int(outs[action]["shape"][-1]) if action in outs else 0,
                             int(d.get("chunk_size") or d.get("horizon") or 1),
                             [k for k, f in ins.items() if f.get("type") == "VISUAL"], train=train, notes=notes)
        if "model" in d:  # a roboloop VLA folder from before policy.json
            m, data = d["model"], d.get("data", {})
            cams = data.get("camera_keys", data.get("video_keys")) or [] if data.get("with_video", True) else []
            return ModelInfo("vla", data.get("state_key", "observation.state"), data.get("action_key", "action"),
                             m["state_dim"], m["action_dim"], m["horizon"], list(cams), data.get("cameras", []),
                             d.get("train", {}), d.get("split") or {})
    raise FileNotFoundError(f"{folder}: no {POLICY_FILE} (nor a roboloop config.json); not a roboloop model folder")


def load_policy(folder: str | Path, device: str = "cpu", seed: int = 0,
                inference_steps: int | None = None, precision: str = "fp32") -> Policy:
    """A model folder as a Policy, loaded by the family that wrote it; `precision="bf16"` acts under bf16
    autocast where the device multiplies bf16 natively (`roboloop.policies.precision`), else it is refused."""
    from roboloop.policies.precision import acting, require_acting_precision

    folder = Path(folder)
    if not (folder / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{folder}: missing {WEIGHTS_FILE}; not a finished model folder")
    require_acting_precision(precision, device)
    return acting(family(model_info(folder).family).load(folder, device, seed, inference_steps), precision, device)


def resolve_family(name: str, policy_type: str | None) -> str:
    """The family a recipe trains: a LeRobot `policy_type` means LeRobot's family (over the default, the VLA), and
    LeRobot's family needs one."""
    if policy_type and name == "vla":
        return "lerobot"
    if name == "lerobot" and not policy_type:
        raise ValueError("family lerobot needs policy_type (e.g. act)")
    return name


def policy_choice(choice: str) -> dict[str, Any]:
    """A form's `policy` choice ('vla', or one of LeRobot's policy types) as the TrainRecipe fields it sets."""
    return {"family": "vla", "policy_type": None} if choice == "vla" else {"policy_type": choice}


def can(name: str, capability: str) -> bool:
    """Whether family `name` can do `capability` (as its `capabilities` say): 'rl' (RL fine-tuning), 'env_state'
    (reads `observation.environment_state` as an input), 'onnx' (ONNX export; its `onnx_export` and `onnx_policy`
    name the functions)."""
    return capability in family(name).capabilities


def require(folder: str | Path, capability: str, what: str) -> None:
    """Refuse, naming the family, a folder whose family cannot do `capability` (e.g. RL fine-tuning)."""
    name = model_info(folder).family
    if capability not in family(name).capabilities:
        raise UnknownFamilyError(f"{folder}: {what} is not available for policy family {name!r}")
