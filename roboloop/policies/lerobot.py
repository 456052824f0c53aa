"""LeRobot's own policies (ACT, Diffusion, VQ-BeT, SmolVLA) as a roboloop policy family: LeRobot builds, normalises
and saves them, roboloop's loader feeds them and roboloop's trainer trains them.

Built with LeRobot's config classes (`make_policy_config(type, **policy_config)`: every option LeRobot's
config has, named as LeRobot names it) and its pre/post-processors (normalisation with the dataset's
stats). Inputs are the dataset's state, its colour cameras, each at its own stored resolution, and its
`observation.environment_state` as LeRobot's ENV feature (as `lerobot-train` feeds it; the recipe's
`env_state_input: off` leaves it out, e.g. a simulator's privileged state); a policy that reads several frames
(Diffusion's `n_obs_steps`) gets them from the loader, the Evaluator and offline scoring alike. Pretrained
backbones come only from local folders: `pretrained_backbone_weights` defaults to none (LeRobot's default
downloads ImageNet weights), and Diffusion's backbone then uses GroupNorm, as LeRobot's from-scratch configs do.

Model folder: what LeRobot's `save_pretrained` writes (config.json, model.safetensors and the processors'
policy_preprocessor.json / policy_postprocessor.json with their state files), so LeRobot's own
`PreTrainedPolicy.from_pretrained(DIR)` and `make_pre_post_processors(cfg, pretrained_path=DIR)` read it;
roboloop's metadata is beside it in policy.json and stats.json.
"""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from roboloop.datasets.layout import ENV_STATE
from roboloop.errors import RoboloopError
from roboloop.policies import DataNeeds, Features, ModelInfo, model_info
from roboloop.policies.lerobot_types import REFUSED, SUPPORTED
from roboloop.policies.obs import Obs
from roboloop.training.packing import PackedBatch

NO_DOWNLOAD = {"pretrained_backbone_weights": None}  # LeRobot's defaults that would reach for the network
# a backbone trained from scratch: GroupNorm (LeRobot's own choice without pretrained weights, as in its PushT
# configs; Diffusion's BatchNorm cannot even be built on small images)
FROM_SCRATCH = {"diffusion": {"use_group_norm": True}, "vqbet": {"use_group_norm": True}}


# LeRobot's VQ-BeT moves its codebook's fp32 averages towards the batch's codes in place (`old.lerp_(new, ...)` in
# lerobot/policies/vqbet/vqbet_utils.py `ema_inplace`), which fails when autocast made `new` bf16
VQBET_FP32 = ("vqbet trains in fp32 only: its VQ-VAE updates its codebook in place with autocast's bf16 codes "
              "(LeRobot's ema_inplace: expected dtype float for `end`)")

# each policy's pretrained backbone, the module `train.finetune frozen_backbone` freezes (names in LeRobot's policy)
BACKBONES = {"smolvla": "model.vlm_with_expert.vlm", "act": "model.backbone", "diffusion": "diffusion.rgb_encoder",
             "vqbet": "vqbet.rgb_encoder"}

# policies that read the task string (tokenised by their own processor step); the others are handed ""
READS_LANGUAGE = frozenset({"smolvla"})
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".msgpack", ".h5")


class LeRobotPolicyError(RoboloopError):
    pass


def _local_vlm(policy_type: str, overrides: dict) -> dict:
    """SmolVLA's backbone (LeRobot's default is a Hub id) from a local folder; its weights are loaded when the
    folder has them unless `load_vlm_weights` says otherwise (LeRobot's default, False, starts the VLM from random
    weights and, with `train_expert_only`, keeps it so)."""
    if policy_type != "smolvla":
        return {}
    vlm = overrides.get("vlm_model_name")
    if not vlm or not Path(vlm).is_dir():
        raise LeRobotPolicyError(
            "smolvla needs its SmolVLM2 backbone from a local folder (nothing is downloaded here): pass "
            "--policy-config '{\"vlm_model_name\": \"/models/SmolVLM2-500M-Video-Instruct\"}' "
            f"({'not a folder: ' + str(vlm) if vlm else 'no vlm_model_name was given'})")
    has_weights = any(f.suffix in WEIGHT_SUFFIXES for f in Path(vlm).iterdir())
    return {"vlm_model_name": str(Path(vlm).resolve()), "load_vlm_weights": has_weights}


def policy_config(policy_type: str, overrides: dict, horizon: int | None, device: str):
    """LeRobot's config for `policy_type` with roboloop's offline defaults and the user's overrides."""
    from lerobot.policies.factory import make_policy_config

    if policy_type in REFUSED:
        raise LeRobotPolicyError(f"policy_type {policy_type!r} {REFUSED[policy_type]}")
    if policy_type not in SUPPORTED:
        raise LeRobotPolicyError(f"policy_type {policy_type!r} is not one roboloop trains: use one of {SUPPORTED}")
    trainer_owned = sorted(k for k in overrides if k.startswith(("optimizer_", "scheduler_")))
    if trainer_owned:  # LeRobot's optimiser preset is lerobot-train's; roboloop's trainer would ignore these
        raise LeRobotPolicyError(
            f"policy_config for {policy_type}: {', '.join(trainer_owned)} would do nothing here: roboloop's trainer "
            "sets the optimiser from the recipe's lr, weight_decay, grad_clip, warmup_steps and lr_schedule (one "
            "learning rate for every parameter). LeRobot's ACT preset, for instance, is lr 1e-5, weight_decay 1e-4, "
            "grad_clip 10, lr_schedule constant, warmup_steps 0")
    chunk = {"chunk_size": horizon, "n_action_steps": horizon} if horizon and policy_type == "act" else {}
    from lerobot.configs.policies import PreTrainedConfig

    local = _local_vlm(policy_type, overrides)
    fields = PreTrainedConfig.get_choice_class(policy_type).__dataclass_fields__
    kw = {**{k: v for k, v in NO_DOWNLOAD.items() if k in fields}, **FROM_SCRATCH.get(policy_type, {}), **chunk,
          **local, **{k: v for k, v in overrides.items() if k != "vlm_model_name"}}
    try:
        pcfg = make_policy_config(policy_type, device=device, **kw)
    except TypeError as e:  # an option LeRobot's config does not have
        raise LeRobotPolicyError(f"policy_config for {policy_type}: {e}") from e
    for name, value in kw.items():  # JSON has lists where LeRobot's config declares tuples (crop_shape, down_dims,
        # whatever the default: crop_shape's is None); its saver needs them (a list fails at the end of training)
        if isinstance(value, list) and name in fields and "tuple" in str(fields[name].type):
            setattr(pcfg, name, tuple(value))
    return pcfg


def _lerobot_stats(stats: dict, keys: list[str]) -> dict:
    return {k: {s: torch.as_tensor(np.asarray(v, dtype=np.float32)) for s, v in stats[k].items()}
            for k in keys if k in stats}


class LossModule(nn.Module):
    """The LeRobot policy with its training loss as `forward` (what DDP/FSDP wrap)."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, batch: dict) -> torch.Tensor:
        loss, _ = self.policy.forward(batch)
        return loss

    def fsdp_units(self) -> list[nn.Module]:
        """FSDP2's sharding units: the layers LeRobot's policies keep in ModuleLists (ACT's encoder and decoder
        layers, Diffusion's U-Net blocks), deepest first. Only modules that are called (never a ModuleList,
        whose parameters no forward hook would gather) and that hold parameters."""
        units = [m for parent in self.modules() if isinstance(parent, nn.ModuleList) for m in parent
                 if not isinstance(m, nn.ModuleList | nn.ModuleDict) and any(True for _ in m.parameters())]
        order = {id(m): i for i, m in enumerate(self.modules())}
        return sorted(units, key=lambda m: -order[id(m)])

    def compile_regions(self) -> list[nn.Module]:
        """What `train.compile` compiles, one region each: the outermost sharding units (ACT's encoder and decoder
        layers, Diffusion's U-Net blocks and its image encoders' backbones: not the whole encoder, whose random crop
        reads its offset back to Python, a graph break each call). Compiling ACT's ResNet backbone as well measured no
        faster here."""
        units = self.fsdp_units()
        inner = {id(m) for u in units for m in u.modules() if m is not u}
        return [getattr(u, "backbone", u) for u in units if id(u) not in inner]


class VQBeTLossModule(LossModule):
    """VQ-BeT trains in two phases inside its own `forward`: its residual VQ-VAE on action chunks for
    `n_vqvae_training_steps` steps, then (the VQ-VAE frozen) the GPT and its bin and offset heads. LeRobot counts
    the first phase in a plain attribute (`optimized_steps`) that no state dict holds; here it travels in the
    checkpoints, and weights saved after the switch (a checkpoint, or a model continued by `init_from`) freeze the
    VQ-VAE again as LeRobot's switch did, so a resumed run goes on exactly where it stopped."""

    def __init__(self, policy: nn.Module):
        super().__init__(policy)
        policy.register_load_state_dict_post_hook(_refreeze_vqvae)  # fires for the policy's own loads too
        self.last: dict = {}  # the last step's phase and LeRobot's numbers for it (metrics.jsonl)

    @property
    def _vqvae(self) -> nn.Module:
        return self.policy.vqbet.action_head.vqvae_model

    def forward(self, batch: dict) -> torch.Tensor:
        phase = "gpt" if bool(self._vqvae.discretized) else "vqvae"
        loss, info = self.policy.forward(batch)
        self.last = {"vqbet_phase": phase, **{f"vqbet_{k}": v for k, v in info.items() if isinstance(v, int | float)}}
        return loss

    def get_extra_state(self) -> dict:
        return {"vqvae_optimized_steps": int(self._vqvae.optimized_steps)}

    def set_extra_state(self, state: dict) -> None:
        self._vqvae.optimized_steps = int(state["vqvae_optimized_steps"])


def _refreeze_vqvae(policy: nn.Module, _keys) -> None:
    vq = policy.vqbet.action_head.vqvae_model
    if bool(vq.discretized):  # what LeRobot's `discretize` does on the step that ends the first phase
        vq.vq_layer.freeze_codebook.fill_(True)
        vq.eval()
        for param in vq.vq_layer.parameters():
            param.requires_grad = False


@dataclass
class LeRobotTrainable:
    module: LossModule
    needs: DataNeeds
    cfg: Any  # LeRobot's PreTrainedConfig
    preprocessor: Any  # its PolicyProcessorPipelines
    postprocessor: Any
    state_key: str
    cameras: list[str]
    one_rank_only: str | None = None  # why this policy cannot train on several ranks
    layout: dict | None = None  # what `convs.speed_up` did to its convolutions (recorded with the run)
    fp32_only: str | None = None  # why it cannot train under bf16 autocast

    @property
    def kind(self) -> str:
        """What `compile=auto`'s measurements are keyed by: LeRobot's policy type."""
        return str(self.cfg.type)

    @property
    def reads_language(self) -> bool:
        return self.cfg.type in READS_LANGUAGE

    @staticmethod
    def tasks(b: PackedBatch) -> list[str]:
        """Each sample's task string, from its byte tokens (BOS, EOS and padding are ids 256 and up)."""
        text = [bytearray() for _ in range(b.num_samples)]
        for t, owner in zip(b.tokens.tolist(), b.token_sample.tolist(), strict=True):
            if t < 256:
                text[owner].append(t)
        return [bytes(t).decode("utf-8", errors="replace") for t in text]

    def batch(self, b: PackedBatch) -> dict:
        """roboloop's packed batch as the dict LeRobot's preprocessor takes (raw units; images in [0, 1]; with
        history, states (N, n, S) and images (N, n, 3, H, W), oldest first)."""
        n = self.needs.history
        out: dict = {self.state_key: (b.states_hist if n > 1 else b.states).float(), "action": b.actions.float(),
                     "action_is_pad": ~b.action_mask,
                     "task": self.tasks(b) if self.reads_language else [""] * b.num_samples}
        if self.needs.env_state:  # (N, E), with history (N, n, E): as LeRobot's delta_timestamps stack it
            out[ENV_STATE] = b.env_state.float()
        images = b.image_input() if self.cameras else b.images
        for c, key in enumerate(self.cameras):
            # every sample has every camera, in this order (collate stacks them sample by sample); the sizes are
            # the features' own: no mask or size read back from the device, which would wait for the GPU
            _, h, w = self.cfg.input_features[key].shape
            img = images[c::len(self.cameras)][:, :, :h, :w]
            out[key] = img.reshape(img.shape[0], n, 3, h, w) if n > 1 else img
        return out

    def loss_inputs(self, batch: PackedBatch, keys: list[int], step: int, denominator: float) -> tuple:
        return (self.preprocessor(self.batch(batch)),)

    def finetune_spec(self) -> tuple[nn.Module, str | None, str | None]:
        """What `train.finetune` works on (roboloop/training/finetune.py): LeRobot's policy, its backbone's name
        prefix, and the LoRA targets LeRobot itself gives `lerobot-train --peft` (`_get_default_peft_targets`)."""
        policy = self.module.policy
        targets = (policy._get_default_peft_targets() or {}).get("target_modules")
        return policy, BACKBONES.get(str(self.cfg.type)), targets

    def flops(self, batch: PackedBatch) -> float | None:
        return None

    def extra_metrics(self) -> dict:
        return dict(getattr(self.module, "last", {}))

    def kernels(self, device_type: str, dtype: torch.dtype) -> dict:
        return dict(self.layout or {})


class LeRobotFamily:
    """`policy_type` picks LeRobot's policy (`TrainRecipe.policy_type`); `policy_config` sets its options."""

    name = "lerobot"
    # env_state: LeRobot's policies take observation.environment_state as their ENV input; onnx: ACT's network
    capabilities: frozenset[str] = frozenset({"env_state", "onnx"})
    onnx_export = "roboloop.serving.export_lerobot:export_lerobot"  # what `roboloop export` runs (code, not a file)
    onnx_policy = "roboloop.serving.export_lerobot:OnnxLeRobotPolicy"  # what `roboloop serve EXPORT_DIR` acts with

    def build(self, cfg, features: Features) -> LeRobotTrainable:
        from lerobot.configs.types import FeatureType, PolicyFeature
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors

        if not cfg.policy_type:
            raise LeRobotPolicyError("family lerobot needs train.policy_type (e.g. act)")
        device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
        horizon = cfg.model_overrides.get("horizon")
        pcfg = policy_config(cfg.policy_type, dict(cfg.policy_config), int(horizon) if horizon else None, device)
        colour = [c for c in features.cameras if not c.get("depth")]
        if cfg.env_state_input == "on" and not features.env_state_dim:
            raise LeRobotPolicyError(f"env_state_input on: the dataset has no {ENV_STATE} (its features: "
                                     f"{features.state_key}, {features.action_key}"
                                     + "".join(f", {c['key']}" for c in features.cameras) + ")")
        env = {ENV_STATE: PolicyFeature(FeatureType.ENV, (features.env_state_dim,))} \
            if features.env_state_dim and cfg.env_state_input != "off" else {}
        pcfg.input_features = {features.state_key: PolicyFeature(FeatureType.STATE, (features.state_dim,)), **env,
                               **{c["key"]: PolicyFeature(FeatureType.VISUAL, (3, *c["shape"]))
                                  for c in colour}}
        pcfg.output_features = {features.action_key: PolicyFeature(FeatureType.ACTION, (features.action_dim,))}
        try:
            pcfg.validate_features()
        except ValueError as e:
            raise LeRobotPolicyError(f"{cfg.policy_type} cannot train on this dataset: {e}") from e
        for cap, key, dim in (("max_state_dim", features.state_key, features.state_dim),
                              ("max_action_dim", features.action_key, features.action_dim)):
            if dim > getattr(pcfg, cap, dim):  # SmolVLA pads to these; more fails deep in a matmul
                raise LeRobotPolicyError(f"{cfg.policy_type} cannot train on this dataset: {key} has {dim} "
                                         f"dimensions, more than its {cap}={getattr(pcfg, cap)} (--policy-config)")
        policy = get_policy_class(cfg.policy_type)(config=pcfg)
        from roboloop.training import convs

        # frozen norms folded into their convs, channels-last weights: the same arithmetic, faster
        layout = convs.speed_up(policy, "strategy=fsdp: FSDP2 shards only contiguous parameters"
                                if cfg.strategy in ("fsdp", "hsdp") else None)
        stats = _lerobot_stats(features.stats, [features.state_key, features.action_key, *env,
                                                *[c["key"] for c in colour]])
        pre, post = make_pre_post_processors(pcfg, dataset_stats=stats)
        # the loader's action window is LeRobot's `action_delta_indices`: from the oldest observed frame on (ACT: t
        # to t+chunk_size-1; Diffusion: t-1 on, `horizon` steps; VQ-BeT: t-n_obs_steps+1 to its last predicted chunk)
        history = int(getattr(pcfg, "n_obs_steps", 1) or 1)
        window = list(pcfg.action_delta_indices)
        if window != list(range(1 - history, 1 - history + len(window))):
            raise LeRobotPolicyError(f"{cfg.policy_type}: action_delta_indices {window} are not consecutive steps "
                                     f"from the oldest of its {history} observed frames, the window roboloop loads")
        needs = DataNeeds(horizon=len(window), cameras=bool(colour), image_size=None, tokens_per_image=0,
                          token_budget=False, max_text_len=1024 if pcfg.type in READS_LANGUAGE else 2,
                          normalized=False,
                          camera_keys=tuple(c["key"] for c in colour),
                          history=history, drop_last=int(getattr(pcfg, "drop_n_last_frames", 0) or 0),
                          env_state=bool(env))
        vqbet = cfg.policy_type == "vqbet"
        return LeRobotTrainable((VQBeTLossModule if vqbet else LossModule)(policy), needs, pcfg, pre, post,
                                features.state_key, [c["key"] for c in colour],
                                one_rank_only="vqbet switches from training its VQ-VAE to training its GPT in the "
                                "middle of a run, changing which parameters train (one rank only)" if vqbet else None,
                                layout=layout, fp32_only=VQBET_FP32 if vqbet else None)

    def load_init(self, trainable: LeRobotTrainable, init: Path, keys: list[str]) -> dict:
        from safetensors.torch import load_file

        from roboloop.errors import ModelMismatchError

        if model_info(init).family != self.name:
            raise LeRobotPolicyError(f"init_from {init}: not a LeRobot policy folder")
        try:
            trainable.module.policy.load_state_dict(load_file(init / "model.safetensors"))
        except RuntimeError as e:
            raise ModelMismatchError(f"init_from {init}: its weights do not fit this policy_config "
                                     f"({str(e).splitlines()[0]})") from e
        if (init / "stats.json").is_file():
            stats = json.loads((init / "stats.json").read_text())
        else:  # a lerobot-train folder: the normaliser it was trained with
            stats = {k: {s: np.asarray(v).tolist() for s, v in d.items()}
                     for k, d in LeRobotPolicy(init).stats.items()}
        return {k: v for k, v in stats.items() if k in keys}

    def write_meta(self, out: Path, trainable: LeRobotTrainable, info: ModelInfo, data: dict) -> None:
        trainable.cfg._save_pretrained(out)  # config.json, as LeRobot's save_pretrained writes it
        trainable.preprocessor.save_pretrained(out)
        trainable.postprocessor.save_pretrained(out)
        if trainable.cfg.type == "smolvla":  # the VLM's config and processor (not its weights: model.safetensors
            _copy_vlm_files(Path(trainable.cfg.vlm_model_name), out / VLM_DIR)  # has them) travel with the model

    def weights(self, state: dict) -> dict:
        """The trained module's weights as LeRobot's policy names them (the trainer's own state left out)."""
        return {k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")}

    def load(self, folder: Path, device: str = "cpu", seed: int = 0,
             inference_steps: int | None = None) -> LeRobotPolicy:
        return LeRobotPolicy(Path(folder), device)


VLM_DIR = "vlm"  # in a SmolVLA model folder: its backbone's config, tokenizer and processor files


def _copy_vlm_files(src: Path, dst: Path) -> None:
    import shutil

    from roboloop import fsutil

    tmp = fsutil.temp_sibling(dst)
    try:
        shutil.copytree(src, tmp, ignore=lambda _d, names: [n for n in names if n.endswith(WEIGHT_SUFFIXES)])
        if dst.exists():
            shutil.rmtree(dst)  # a folder this run's trainer wrote (the model folder is its own)
        tmp.rename(dst)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _fold_for_acting(policy: nn.Module) -> None:
    """1.16x per chunk at 480x640 for ACT at batch 1, 1.4x at batch 8, no slower at 96x128 (this 2-core CPU); the
    same chunks (tests/unit/training/test_convs.py). The policy object is never saved."""
    from roboloop.training import convs

    if convs.fold_for_inference(policy):
        convs.channels_last(policy)
    convs.pool_before_relu(policy)


class LeRobotPolicy:
    """A LeRobot model folder (written by roboloop or by `lerobot-train`) acting on roboloop observations."""

    def __init__(self, folder: Path, device: str = "cpu", weights: bool = True):
        """`weights=False`: LeRobot's config and pre/post-processors only (an ONNX export runs the network)."""
        from lerobot.configs.policies import PreTrainedConfig
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors

        from roboloop.policies.trust import check_processor_steps

        self.dir = folder
        info = model_info(folder)
        check_processor_steps(folder)  # before LeRobot's loader would import what a step's "class" names
        cfg = PreTrainedConfig.from_pretrained(str(folder))
        cfg.device = device
        overrides: dict = {"device_processor": {"device": device}}
        if cfg.type == "smolvla" and (folder / VLM_DIR).is_dir():  # the backbone's files that travel with it: the
            vlm = str((folder / VLM_DIR).resolve())  # folder it was trained from need not exist here
            cfg.vlm_model_name, cfg.load_vlm_weights = vlm, False  # (model.safetensors holds the VLM's weights)
            overrides["tokenizer_processor"] = {"tokenizer_name": vlm}
        self.cfg = cfg
        self.policy = None
        if weights:  # LeRobot prints "Loading weights from local directory"; a command's stdout is its result
            with contextlib.redirect_stdout(sys.stderr):
                self.policy = get_policy_class(cfg.type).from_pretrained(str(folder), config=cfg).eval()
        if self.policy is not None:  # acting only: ACT's frozen norms folded into its convs for good, channels-last
            _fold_for_acting(self.policy)
        self.pre, self.post = make_pre_post_processors(cfg, pretrained_path=str(folder),
                                                       preprocessor_overrides=overrides)
        self.name = f"{cfg.type}:{folder.name}"
        self.state_key, self.action_key = info.state_key, info.action_key
        self.state_dim, self.action_dim = info.state_dim, info.action_dim
        # the chunk `act` returns, from the current frame on: Diffusion's n_action_steps, VQ-BeT's
        # action_chunk_size, ACT's chunk_size
        self.horizon = {"diffusion": lambda: int(cfg.n_action_steps),
                        "vqbet": lambda: int(cfg.action_chunk_size)}.get(cfg.type, lambda: info.horizon)()
        self.camera_keys = [k for k, f in cfg.input_features.items() if f.type.name == "VISUAL"]
        shape = cfg.input_features[self.camera_keys[0]].shape if self.camera_keys else (3, 0, 0)
        self.image_size = (int(shape[1]), int(shape[2]))
        own: dict = next((st.stats for st in self.pre.steps if getattr(st, "stats", None)), {})  # the normaliser's
        raw = json.loads((folder / "stats.json").read_text()) if (folder / "stats.json").is_file() else {}
        if not raw:  # a lerobot-train folder
            raw = own
        if ENV_STATE in cfg.input_features and ENV_STATE in own:  # roboloop's stats.json has state and action
            raw = {**raw, ENV_STATE: own[ENV_STATE]}
        self.stats = {k: {s: np.asarray(torch.as_tensor(v).cpu(), dtype=np.float32) for s, v in d.items()}
                      for k, d in raw.items()}
        self.history = int(getattr(cfg, "n_obs_steps", 1) or 1)  # frames per observation (the Evaluator's past)
        env = cfg.input_features.get(ENV_STATE)  # LeRobot's ENV feature: the scene's state, read at every step
        self.env_state_dim = int(env.shape[0]) if env is not None else 0

    def _frames(self, obs: Obs, key: str, j: int) -> torch.Tensor:
        frames = obs.images[key] if key in obs.images else list(obs.images.values())[j]
        x = torch.as_tensor(frames).permute(0, 3, 1, 2).float() / 255.0
        want = tuple(self.cfg.input_features[key].shape[1:])
        if tuple(x.shape[-2:]) != want:
            x = torch.nn.functional.interpolate(x, size=want, mode="bilinear", antialias=True)
        return x

    def _env_state(self, obs: Obs) -> torch.Tensor:
        if obs.env_state is None:
            raise LeRobotPolicyError(
                f"{self.name} reads {ENV_STATE} ({self.env_state_dim} values) at every step and this observation has "
                "none: act where the scene's state is observed (roboloop's tasks give it to policies that read it; "
                "lerobot:pusht?obs_type=environment_state_agent_pos; a server's client sends it), or train with "
                "env_state_input off")
        x = obs.env_state.float()
        if x.shape[-1] != self.env_state_dim:
            raise LeRobotPolicyError(f"{self.name} reads {ENV_STATE} with {self.env_state_dim} values, the "
                                     f"observation has {x.shape[-1]}: it was trained on another scene")
        return x

    @torch.no_grad()
    def act(self, obs: Obs) -> torch.Tensor:
        """(N, H, A) chunks; a history policy stacks `obs.past` (oldest first) and `obs` (no past: the current
        frame repeated, as at an episode's start)."""
        return self.post(self.chunk(self.inputs(obs))).float().cpu()

    def inputs(self, obs: Obs) -> dict:
        """The observation as LeRobot's preprocessor leaves it (normalised, on the device)."""
        frames = [*(obs.past or [obs] * (self.history - 1))[-(self.history - 1):], obs] if self.history > 1 \
            else [obs]
        batch: dict = {self.state_key: obs.state.float(), "task": list(obs.instructions or [""] * obs.state.shape[0])}
        if self.history > 1:
            batch[self.state_key] = torch.stack([f.state.float() for f in frames], dim=1)
        if self.env_state_dim:
            env = [self._env_state(f) for f in frames]
            batch[ENV_STATE] = torch.stack(env, dim=1) if self.history > 1 else env[0]
        for j, key in enumerate(self.camera_keys):
            x = [self._frames(f, key, j) for f in frames]
            batch[key] = torch.stack(x, dim=1) if self.history > 1 else x[0]
        return self.pre(batch)

    def chunk(self, inputs: dict) -> torch.Tensor:
        """The normalised chunk for preprocessed inputs (the network's part of `act`)."""
        if self.cfg.type == "vqbet":  # its predict_action_chunk reads only select_action's queues: the same call
            from lerobot.utils.constants import OBS_IMAGES

            batch = {**inputs, OBS_IMAGES: torch.stack([inputs[k] for k in self.cfg.image_features], dim=-4)}
            return self.network.vqbet(batch, rollout=True)[:, :self.cfg.action_chunk_size]
        return self.network.predict_action_chunk(inputs)

    @property
    def network(self):
        """LeRobot's policy module; a folder opened with `weights=False` (processors and schema only) has none."""
        if self.policy is None:
            raise RuntimeError(f"{self.dir} was opened without its weights: it cannot act")
        return self.policy
