"""Typed training configuration: one pydantic model for the CLI, the flows and torchrun ranks.

Presets are functions (torchtitan style); variants derive from a base by changing fields.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from roboloop.policies.lerobot_types import SUPPORTED as LEROBOT_TYPES

BYTE_VOCAB = 259  # 256 bytes + pad, bos, eos


class ModelConfig(BaseModel):
    image_size: tuple[int, int] = Field((64, 64), description="(H, W) images are resized to")
    patch_size: int = Field(16, gt=0)
    image_encoder: Literal["patch", "keypoints"] = Field(
        "patch", description="from-scratch image encoder: ViT patches, or a conv stem with spatial-softmax "
        "keypoints (one token per keypoint; localises small objects, see roboloop.training.vision)")
    keypoints: int = Field(32, gt=0, description="keypoint tokens per image (image_encoder=keypoints)")
    keypoints_to_state: bool = Field(False, description="image_encoder=keypoints: the keypoints' coordinates also "
                                     "feed the state token's MLP (state_encoder=mlp)")
    aux_dim: int = Field(0, ge=0, description="size of the auxiliary target the image tokens learn to predict "
                         "(set from the recipe's aux_target; 0: none)")
    aux_to_state: bool = Field(False, description="aux_dim > 0: each camera slot's auxiliary prediction (detached) "
                               "also feeds the state token's MLP, so the policy acts on what it perceived "
                               "(state_encoder=mlp)")
    max_cameras: int = Field(4, gt=0)
    vocab_size: int = BYTE_VOCAB
    max_text_len: int = Field(96, gt=0, description="instruction tokens kept (bytes by default)")
    state_dim: int = Field(6, gt=0)
    action_dim: int = Field(6, gt=0)
    horizon: int = Field(16, gt=0, description="action chunk length H")
    dim: int = Field(128, gt=0, description="backbone width")
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    head_dim_model: int = Field(128, gt=0, description="action-head (DiT) width")
    head_layers: int = Field(2, ge=1)
    head_heads: int = Field(4, ge=1)
    head_head_dim: int | None = Field(None, description="per-head dim of the DiT (GR00T: 48)")
    inference_steps: int = Field(4, ge=1, description="Euler steps K at inference")
    initial_noise: Literal["sample", "zero"] = Field(
        "sample", description="x_0 of the denoising at inference: a draw from N(0, I) (the flow's distribution), "
        "or 0 (its deterministic centre: what a policy RL-fine-tuned with x0=zero was trained to act from)")
    state_encoder: Literal["mlp", "per_dim"] = Field(
        "mlp", description="proprioceptive state as one token (an MLP of the whole vector) or one token per "
        "dimension (value x learned direction + learned dimension embedding), which lets attention pick out "
        "the dimensions an instruction refers to")
    attention: Literal["auto", "flash", "torch_varlen", "sdpa"] = "auto"
    vision_encoder: str | None = Field(None, description="local folder of a Hugging Face vision model "
                                       "(ViT/SigLIP/DINOv2); default: a patch encoder trained from scratch")
    tokenizer: str | None = Field(None, description="local folder of a Hugging Face tokenizer; "
                                  "default: byte-level tokens")

    @property
    def num_state_tokens(self) -> int:
        return self.state_dim if self.state_encoder == "per_dim" else 1

    @property
    def tokens_per_image(self) -> int:
        if self.image_encoder == "keypoints" and not self.vision_encoder:
            return self.keypoints
        h, w = self.image_size
        return (h // self.patch_size) * (w // self.patch_size)


def tiny(**kw) -> ModelConfig:
    """CPU-sized: learns a small task in minutes."""
    return ModelConfig(**{"image_size": (64, 64), "patch_size": 16, "dim": 96, "layers": 2, "heads": 4,
                          "head_dim_model": 96, "head_layers": 2, "head_heads": 4, **kw})


def small(**kw) -> ModelConfig:
    return ModelConfig(**{"image_size": (128, 128), "patch_size": 16, "dim": 384, "layers": 6, "heads": 6,
                          "head_dim_model": 384, "head_layers": 6, "head_heads": 6, **kw})


def base(**kw) -> ModelConfig:
    """~1B parameters: the size where FP8 can pay off on Hopper (bench/precision.py measures whether it does)."""
    return ModelConfig(**{"image_size": (224, 224), "patch_size": 14, "dim": 2048, "layers": 4, "heads": 16,
                          "head_dim_model": 1536, "head_layers": 16, "head_heads": 32, "head_head_dim": 48, **kw})


def n15(**kw) -> ModelConfig:
    """GR00T-N1.5's action-head dimensions: 16 DiT layers, 1536 wide, 32 heads x 48, horizon 16."""
    return ModelConfig(**{"image_size": (224, 224), "patch_size": 14, "dim": 2048, "layers": 12, "heads": 16,
                          "head_dim_model": 1536, "head_layers": 16, "head_heads": 32, "head_head_dim": 48,
                          "horizon": 16, **kw})


PRESETS = {"tiny": tiny, "small": small, "base": base, "n15": n15}


class TrainRecipe(BaseModel):
    """How to train: model, optimisation, data pipeline, checkpoints. The closed loop's parameter (the
    dataset and the output folder are the loop's to choose); `TrainConfig` adds them."""
    # cache keys (roboloop.keys): what shapes the output, and what only changes how fast or how often
    KEYED: ClassVar[frozenset[str]] = frozenset({
        "accumulate", "grad_reduce", "aux_target", "aux_weight", "deterministic", "device", "family", "fp8_backend",
        "grad_clip", "init_from", "lr", "max_samples", "max_tokens", "model_overrides", "policy_config",
        "policy_type", "precision", "preset", "seed", "shuffle_buffer", "steps", "strategy", "val_fraction",
        "warmup_steps", "weight_decay", "window", "with_video", "lr_schedule", "ema_decay", "image_shift",
        "env_state_input", "sample_order", "compile", "fp8_recipe", "finetune", "lora_rank", "lora_alpha",
        "lora_targets"})
    NOT_KEYED: ClassVar[frozenset[str]] = frozenset({
        "checkpoint_every_minutes", "checkpoint_every_steps", "keep_last", "log_every", "num_workers", "prefetch",
        "lookahead", "resume", "frame_cache_mb", "host_memory", "activation_checkpointing"})


    family: str = Field("vla", description="policy family (roboloop.policies): vla (roboloop's GR00T-style VLA), or "
                        "package.module:Class of your own PolicyFamily")
    policy_type: str | None = Field(
        None, description="one of LeRobot's policies, trained on roboloop's engine (family lerobot): "
        f"{', '.join(LEROBOT_TYPES)}; the other types in LeRobot's factory are refused with the reason",
        json_schema_extra={"enum": [*LEROBOT_TYPES, None]})
    policy_config: dict[str, Any] = Field(
        default_factory=dict, description="options of LeRobot's config for policy_type, named as LeRobot names "
        "them (e.g. {\"dim_model\": 256, \"chunk_size\": 50}); pretrained backbones only from local folders")
    preset: Literal["tiny", "small", "base", "n15"] = Field("tiny", description="model size preset (family vla)")
    model_overrides: dict[str, int | float | str | list[int]] = Field(
        default_factory=dict, description="fields of ModelConfig to change from the preset")
    steps: int = Field(300, ge=1, description="optimizer steps")
    max_tokens: int = Field(2048, gt=0, description="backbone token budget of one packed batch (per rank; "
                            "family vla: LeRobot's policies pack no tokens and take max_samples)")
    max_samples: int = Field(64, gt=0, description="at most this many samples per pack")
    grad_reduce: Literal["fp32", "bf16"] = Field(
        "fp32", description="the dtype gradients travel in between ranks: bf16 halves the bytes (DDP: a communication "
        "hook casts each bucket; FSDP2: its reduce-scatter's reduce_dtype); weights and the optimizer's state stay "
        "fp32. Refused on one rank (nothing travels)")
    accumulate: int = Field(
        1, ge=1, description="gradient accumulation: micro-batches (each max_tokens / max_samples per rank) per "
        "optimizer step, their gradients synchronised across ranks once, at the last; the loss is normalised by the "
        "whole step's action steps, so N micro-batches on one rank make the update N ranks would. Steps, the "
        "learning-rate schedule, EMA and checkpoints count optimizer steps")
    lr: float = Field(1e-3, gt=0, description="peak learning rate (AdamW)")
    aux_target: str | None = Field(None, description="a dataset feature the image encoder also learns to predict, "
                                   "e.g. observation.environment_state (privileged simulator state recorded by "
                                   "`collect`): a training signal only, never this family's input")
    aux_weight: float = Field(0.3, ge=0, description="weight of the auxiliary target's L1 loss (normalised units)")
    env_state_input: Literal["auto", "on", "off"] = Field(
        "auto", description="LeRobot's policies: the dataset's observation.environment_state as an input (LeRobot's "
        "ENV feature: PushT's keypoints, a scene's tracked object poses), as lerobot-train feeds it. auto: when the "
        "dataset has it; on: required; off: left out (e.g. a simulator's privileged state that the real robot will "
        "not have). The policy then needs it at every step: the Evaluator asks roboloop's tasks for it, a server's "
        "clients send it. Family vla never reads it (its aux_target)")
    warmup_steps: int = Field(20, ge=0, description="linear warm-up steps before the cosine decay")
    lr_schedule: Literal["cosine", "constant"] = Field(
        "cosine", description="after warm-up: cosine decay to a tenth of lr at the last step, or constant (LeRobot's "
                              "ACT preset has no scheduler)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    ema_decay: float = Field(0.0, ge=0, lt=1, description="exponential moving average of the weights (e.g. 0.999, "
                             "about the last 1000 steps): the final model and every checkpoint's export hold the "
                             "average, training steps the raw weights; 0: off")
    image_shift: int = Field(0, ge=0, description="random-shift augmentation (DrQ): each training image moved by up "
                             "to this many pixels per axis at the model's image size, edges repeated; drawn per "
                             "sample from seed and step (exact resume); family vla; 0: off")
    grad_clip: float = Field(1.0, gt=0, description="gradient norm clip")
    precision: Literal["auto", "fp8", "bf16", "fp32"] = Field(
        "auto", description="auto: fp32 on CPU; on a GPU fp8 only where bench/precision.py --grid measured FP8 "
                            "faster, else bf16. bf16 on CPU: autocast, only where the CPU multiplies bf16 natively "
                            "(AMX or AVX512-BF16)")
    fp8_backend: Literal["te", "torchao"] = Field(
        "torchao", description="FP8 implementation when precision=fp8: torchao (what make install brings) or te "
                               "(Transformer Engine, installed separately)")
    fp8_recipe: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"] = Field(
        "tensorwise", description="torchao's float8 scaling when precision is fp8: one scale per tensor, or one "
                                  "per row (more accurate, needs an H100 or newer); rowwise_with_gw_hp keeps the "
                                  "weight gradient in high precision. Transformer Engine (fp8_backend te) scales "
                                  "its own way (DelayedScaling): another recipe than tensorwise is refused there")
    seed: int = Field(0, description="seeds weights, data order and flow-matching noise")
    window: int = Field(32, gt=0, description="frames decoded per sequential video read")
    shuffle_buffer: int = Field(256, gt=0, description="frames mixed across windows and episodes (sample_order "
                                "windows; another value than 256 is refused where the order is uniform)")
    sample_order: Literal["auto", "windows", "uniform"] = Field(
        "auto", description="the order training draws frames in. windows: `window` consecutive frames enter a "
        "`shuffle_buffer` together (video is decoded sequentially; a batch mixes fewer episodes); uniform: each "
        "epoch a new permutation of every frame of the split, as LeRobot's shuffled DataLoader (with cameras, fast "
        "only when the frame cache holds the split's frames); auto: uniform when no camera is fed, windows "
        "otherwise. The run log says which")
    num_workers: int = Field(2, ge=1, description="video decode threads")
    frame_cache_mb: int = Field(2048, ge=0, description="decoded frames (at the model's image size) kept in memory "
                                "across epochs, per rank: a training split whose frames fit is decoded once instead "
                                "of once per epoch (the run log says which); 0: only the windows in flight; same "
                                "batches either way")
    host_memory: Literal["auto", "keep", "system"] = Field(
        "auto", description="keep: glibc keeps freed blocks for the next step instead of unmapping them (a CPU "
                            "step's large activations are not faulted in page by page again; RSS stays at its "
                            "peak); system: glibc's defaults; auto: keep when training on the CPU. Same results "
                            "either way; the run record says what applied")
    with_video: bool = Field(True, description="feed camera frames (False: state + language only)")
    val_fraction: float = Field(0.0, ge=0, lt=1, description="episodes held out for offline validation (drawn by "
                                "`seed`, recorded in the model's config.json; never trained on)")
    init_from: str | None = Field(None, description="a model folder whose weights and normalisation this run starts "
                                  "from (DAgger rounds, fine-tuning); same model config required")
    checkpoint_every_steps: int = Field(100, ge=0, description="0 disables step-based checkpoints")
    checkpoint_every_minutes: float = Field(0.0, ge=0, description="0 disables time-based checkpoints")
    keep_last: int = Field(2, ge=1, description="checkpoints kept")
    resume: bool = Field(True, description="resume from the latest checkpoint in output_dir")
    log_every: int = Field(10, ge=1, description="steps between progress lines")
    device: str = Field("auto", description="auto, cpu or cuda", json_schema_extra={"enum": ["auto", "cpu", "cuda"]})
    strategy: Literal["ddp", "fsdp", "hsdp"] = Field(
        "ddp", description="data parallelism across ranks: replicate (DDP), shard parameters, gradients and optimizer "
        "state over every rank (FSDP2), or shard them within each node and replicate across nodes (HSDP: FSDP2 on a "
        "nodes x ranks-per-node mesh, its all-gathers on the node's own links, one gradient all-reduce across nodes). "
        "Across nodes without a shared folder the shards meet in the run store; checkpoints reload on any number of "
        "ranks")
    prefetch: bool = Field(True, description="prepare the next batch (decode, pin, copy) during the step")
    lookahead: Literal["auto", "on", "off"] = Field(
        "auto", description="with prefetch, also start decoding the batch after the next one, so decoding has a "
                            "whole step to finish (auto: on CUDA, off on CPU, where decode threads compete with "
                            "the step for the cores); same batches either way")
    deterministic: bool = Field(False, description="deterministic kernels (exact resume comparisons)")
    compile: Literal["auto", "on", "off"] = Field(
        "auto", description="torch.compile of the model's blocks (regional, dynamic shapes: packed batches of any "
                            "length reuse them); auto: where bench/compile.py measured it faster for the family and "
                            "device, else eager; the run record says which and why, with graphs and recompiles")
    activation_checkpointing: bool = Field(
        False, description="keep only each block's input through the forward pass and recompute the block's "
        "activations in the backward pass (the blocks compile() names: the VLA's transformer blocks, LeRobot's "
        "layers): less memory for a larger per-GPU step, at about one more forward pass of compute; the same "
        "gradients. Refused for a model with no blocks")
    finetune: Literal["full", "frozen_backbone", "lora"] = Field(
        "full", description="what trains: full (every parameter the policy's own config trains), frozen_backbone "
        "(all but its pretrained backbone: SmolVLA's VLM, ACT's ResNet), lora (PEFT's low-rank adapters on "
        "lora_targets, the rest frozen; the saved model is merged and plain). The run record counts what trained")
    lora_rank: int = Field(16, ge=1, description="finetune lora: the adapters' rank")
    lora_alpha: int | None = Field(None, gt=0, description="finetune lora: the adapters' scale is lora_alpha / "
                                     "lora_rank (default: the rank, a scale of 1)")
    lora_targets: str | None = Field(None, description="finetune lora: a regex of whole module names to adapt "
                                     "(default: the policy's own, those LeRobot gives lerobot-train --peft)")

    @model_validator(mode="after")
    def _policy_type_means_lerobot(self):
        if self.policy_type:
            from roboloop.policies.lerobot_types import check

            check(self.policy_type)
        from roboloop.policies import resolve_family

        self.family = resolve_family(self.family, self.policy_type)
        if self.fp8_recipe != "tensorwise" and (self.fp8_backend == "te" or self.precision in ("bf16", "fp32")):
            raise ValueError(f"fp8_recipe={self.fp8_recipe!r} would do nothing: " + (
                "it is torchao's; Transformer Engine (fp8_backend te) scales with DelayedScaling" if
                self.fp8_backend == "te" else f"precision={self.precision} never trains in FP8"))
        from roboloop.policies import unread_settings

        for name, why in unread_settings(self).items():  # refuse, never ignore: a setting nothing reads
            default = type(self).model_fields[name].get_default(call_default_factory=True)
            if getattr(self, name) != default:
                raise ValueError(f"{name}={getattr(self, name)!r} would do nothing: {why} (leave it at its default, "
                                 f"{default!r})")
        return self

    @classmethod
    def without_unread(cls, data: dict, given: set[str] | frozenset[str] = frozenset()) -> tuple[dict, list[str]]:
        """A recipe's fields (`data`, as dumped) with the ones its family does not read set back to their defaults,
        except those in `given` (what the user named: refused by validation instead). For a preset changed by an
        override (`roboloop loop --preset demo --override '{"train": {"policy_type": "act"}}'`): the demo's
        max_tokens is the VLA's and nobody asked for it. Returns the data and what was set back."""
        from types import SimpleNamespace

        from roboloop.policies import resolve_family, unread_settings

        defaults = {k: f.get_default(call_default_factory=True) for k, f in cls.model_fields.items()}
        view = {**defaults, **data}
        if view.get("policy_type"):  # as the validator will decide
            view["family"] = resolve_family(view["family"], view["policy_type"])
        out, reset = dict(data), []
        for name in unread_settings(SimpleNamespace(**view)):
            if name not in given and name in out and out[name] != defaults[name]:
                out[name] = defaults[name]
                reset.append(name)
        return out, reset

    def keyed_fields(self) -> set[str]:
        """The fields that belong in this recipe's cache key: KEYED less what nothing reads (`unread_settings`)."""
        from roboloop.policies import unread_settings

        return set(self.KEYED) - set(unread_settings(self))

    def model_config_resolved(self, state_dim: int, action_dim: int, aux_dim: int = 0) -> ModelConfig:
        over: dict = {"aux_dim": aux_dim, **self.model_overrides}
        if "image_size" in over and isinstance(over["image_size"], list):
            over["image_size"] = tuple(over["image_size"])  # type: ignore[assignment]
        cfg = PRESETS[self.preset](**{"state_dim": state_dim, "action_dim": action_dim, **over})
        if cfg.tokenizer and "vocab_size" not in over:
            from roboloop.training.hf import tokenizer_vocab_size

            cfg = cfg.model_copy(update={"vocab_size": tokenizer_vocab_size(cfg.tokenizer)})
        return cfg

    # Fields a resumed run may change (how long, how often to save or log); anything else is another run.
    RESUMABLE_CHANGES: ClassVar[frozenset[str]] = frozenset({
        "steps", "checkpoint_every_steps", "checkpoint_every_minutes", "keep_last", "log_every", "resume",
        "num_workers", "prefetch", "lookahead", "output_dir", "dataset", "device", "frame_cache_mb",
        "host_memory", "mirror", "activation_checkpointing", "accumulate"})  # accumulate: checked as slots

    def changed_fields(self, saved: dict) -> list[str]:
        """Fields whose value differs from `saved` (another run's config) and that resuming cannot change."""
        now = self.model_dump(mode="json")
        return sorted(k for k in now if k not in self.RESUMABLE_CHANGES and k in saved and saved[k] != now[k])


class TrainConfig(TrainRecipe):
    """Everything a training run needs; the CLI and every torchrun rank (through `roboloop.entry`) read this."""

    dataset: str = Field(description="LeRobot v3.0 dataset folder (`roboloop train`: or s3://bucket/prefix, "
                         "downloaded and verified into the cache first)")
    output_dir: str = Field("artifacts/train", description="checkpoints, final model, metrics")
    mirror: str | None = Field(None, description="s3:// folder that mirrors output_dir: rank 0 pushes each checkpoint "
                               "there and ranks resume from it (the launcher sets it from ROBOLOOP_RUN_STORE; "
                               "roboloop.training.runstore)")

    @classmethod
    def of(cls, recipe: TrainRecipe, dataset: str, output_dir: str) -> TrainConfig:
        return cls(**recipe.model_dump(), dataset=dataset, output_dir=output_dir)

    def recipe(self) -> TrainRecipe:
        return TrainRecipe(**self.model_dump(exclude={"dataset", "output_dir", "mirror"}))


class LaunchConfig(BaseModel):
    """How many processes, on how many nodes (torchrun's c10d rendezvous).

    Read by the process that launches torchrun, never by the ranks. `from_settings()` takes what a
    cluster job template sets (ROBOLOOP_NPROC_PER_NODE, ROBOLOOP_NNODES, ...; see `roboloop.settings`)."""

    nproc_per_node: int = Field(1, ge=1, description="ranks on this node (GPUs, or CPU processes)")
    nnodes: int = Field(1, ge=1, description="nodes in the job")
    node_rank: int = Field(0, ge=0, description="this node's index (the flow's node is 0)")
    rdzv_endpoint: str | None = Field(
        None, description="host:port of the rendezvous on node 0 (multi-node: required; one node: a free local port)")
    max_restarts: int = Field(0, ge=0, description="torchrun restarts of failed ranks (they auto-resume)")
    run_id: str = Field("roboloop", description="rendezvous id shared by all nodes of one job (unique per job: the "
                        "other nodes find node 0's config under it in the run store)")
    timeout_s: float | None = Field(None, gt=0, description="kill the job after this many seconds")
    collective_timeout_s: float = Field(600, gt=0, description="how long ranks wait for a lost node: in a "
                                        "collective, and to meet again after a restart; then the run fails")
    deployment: str | None = Field(
        None, description="the Prefect deployment that trains on each node (`train-node/train-node`: one flow run per "
        "node on the gpu pool, process workers; this flow orchestrates and takes the model from the run store). "
        "Empty: this node trains, and a Kubernetes Job starts the others")

    @classmethod
    def from_settings(cls, **given) -> LaunchConfig:
        from roboloop.settings import settings

        st = settings()
        env = {"nproc_per_node": st.nproc_per_node, "nnodes": st.nnodes, "node_rank": st.node_rank,
               "rdzv_endpoint": st.rdzv_endpoint, "max_restarts": st.max_restarts, "run_id": st.run_id,
               "collective_timeout_s": st.collective_timeout_s}
        return cls(**{**env, **{k: v for k, v in given.items() if v is not None}})
