"""The training loop: build from a `TrainConfig`, resume if a checkpoint exists, train, save.

Outputs in `output_dir`: checkpoints/ (atomic, last k), heartbeat.json, metrics.jsonl (loss,
lr, samples/s, tokens/s, non-pad fraction, data-wait fraction), and at the end
model.safetensors + config.json + stats.json and loss.png. A NaN/inf loss stops the run
with an error and writes no final model.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from roboloop.training import checkpoint, distributed, precision
from roboloop.training.config import TrainConfig
from roboloop.training.data import Normalizer, SampleStream, V3Dataset
from roboloop.training.model import VLAPolicy, num_parameters
from roboloop.training.packing import PackedBatch, collate

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    pass


class Packer:
    """Forms global packs of keys from the stream; its state includes the one key carried over.

    A global pack holds up to `max_tokens * world_size` backbone tokens (and at least one
    sample per rank); rank r trains on its samples r, r+W, ... (see `distributed`).
    """

    def __init__(self, stream: SampleStream, max_tokens: int, max_samples: int, tokens_per_image: int,
                 world_size: int = 1):
        self.stream, self.tpi, self.world = stream, tokens_per_image, world_size
        self.budget, self.max_samples = max_tokens * world_size, max_samples * world_size
        self.max_tokens = max_tokens
        self.carry: int | None = None
        self.carry_state: dict | None = None

    def next(self) -> list[int]:
        keys: list[int] = [self.carry] if self.carry is not None else []
        used = sum(self.stream.num_tokens(k, self.tpi) for k in keys)
        self.carry = self.carry_state = None
        while True:
            state = self.stream.state_dict()
            k = self.stream.next_key()
            n = self.stream.num_tokens(k, self.tpi)
            if n > self.max_tokens:
                raise ValueError(f"a sample needs {n} tokens, more than max_tokens={self.max_tokens}")
            full = used + n > self.budget or len(keys) >= self.max_samples
            if len(keys) >= self.world and full:
                self.carry, self.carry_state = k, state
                return keys
            keys.append(k)
            used += n

    def state_dict(self) -> dict:
        return self.carry_state if self.carry is not None else self.stream.state_dict()  # type: ignore[return-value]


def flow_noise(keys: list[int], step: int, seed: int, horizon: int, action_dim: int) -> tuple[torch.Tensor, ...]:
    """Per-sample noise and time draws seeded by (seed, step, key): independent of how samples are split."""
    noise, u = [], []
    for k in keys:
        g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 10_000_019 + k)
        noise.append(torch.randn(horizon, action_dim, generator=g))
        u.append(torch.rand(1, generator=g))
    return torch.stack(noise), torch.cat(u)


@dataclass
class TrainResult:
    output_dir: Path
    final_loss: float
    first_loss: float
    steps: int
    resumed_from: int


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train(cfg: TrainConfig) -> TrainResult:
    env = distributed.init(cfg.device)
    try:
        return _train(cfg, env)
    finally:
        distributed.shutdown()


def _train(cfg: TrainConfig, env: distributed.DistEnv) -> TrainResult:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = env.device
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    ds = V3Dataset(cfg.dataset)
    mcfg = cfg.model_config_resolved(ds.state.shape[1], ds.action.shape[1])
    ds.horizon = mcfg.horizon
    norm = Normalizer.from_meta(ds.meta, [ds.state_key, ds.action_key])
    prec = precision.plan(cfg.precision, device.type, cfg.fp8_backend)
    model = VLAPolicy(mcfg).to(device)
    precision.apply_fp8(model, prec)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, cfg))
    stream = SampleStream(ds, mcfg.image_size, mcfg.max_text_len, window=cfg.window,
                          shuffle_buffer=cfg.shuffle_buffer, num_workers=cfg.num_workers, seed=cfg.seed,
                          normalizer=norm, with_video=cfg.with_video)
    start, ckpt_dir = 0, out / "checkpoints"
    found = checkpoint.latest(ckpt_dir) if cfg.resume else None
    if found is not None:
        st = checkpoint.load(found)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        checkpoint.set_rng_state(st["rng"])
        stream.load_state_dict(st["data"])
        start = int(st["step"])
        log.info("resumed from %s (step %d)", found, start)
    ddp_model = distributed.wrap(model, env)
    packer = Packer(stream, cfg.max_tokens, cfg.max_samples, mcfg.tokens_per_image, env.world_size)
    log.info("model %s: %.2fM parameters, precision %s (%s), device %s, rank %d/%d", cfg.preset,
             num_parameters(model) / 1e6, prec.name, prec.reason, device, env.rank, env.world_size)
    metrics_path = out / "metrics.jsonl"
    if env.is_main and metrics_path.exists():  # drop rows a killed run wrote after its last checkpoint
        keep = [r for r in metrics_path.read_text().splitlines() if r.strip() and json.loads(r)["step"] <= start]
        metrics_path.write_text("".join(r + "\n" for r in keep))
    first_loss = last_loss = float("nan")
    last_ckpt_time = time.time()
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc="train",
               disable=None if env.is_main else True)
    try:
        for step in bar:
            t0 = time.perf_counter()
            keys = packer.next()
            mine = keys[env.rank :: env.world_size]
            denom = float(sum(stream.num_valid_steps(k) for k in keys))
            batch = collate(stream.materialize(mine), mcfg.tokens_per_image).to(device, non_blocking=True)
            noise, u = flow_noise(mine, step, cfg.seed, mcfg.horizon, mcfg.action_dim)
            t_data = time.perf_counter() - t0
            with prec.autocast(device.type), precision.fp8_context(prec):
                # Each rank divides by the global count; DDP averages, so scale back by W.
                loss = model.loss(batch, noise=noise, u=u, denominator=denom) \
                    if env.world_size == 1 else _ddp_loss(ddp_model, batch, noise, u, denom, env)
            global_loss = distributed.all_reduce_sum(loss.detach() / env.world_size, env)
            if not torch.isfinite(global_loss):
                raise NonFiniteLossError(f"loss became {global_loss.item()} at step {step}; "
                                         "stopping without a final model")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            dt = time.perf_counter() - t0
            last_loss = global_loss.item()
            if step == start:
                first_loss = last_loss
            tokens = int(batch.seq_lens.sum())
            if env.is_main:
                row = {"step": step + 1, "loss": last_loss, "lr": sched.get_last_lr()[0],
                       "samples_per_s": len(keys) / dt, "tokens_per_s": tokens * env.world_size / dt,
                       "nonpad_fraction": tokens / cfg.max_tokens, "data_wait_fraction": t_data / dt}
                with open(metrics_path, "a") as f:
                    f.write(json.dumps(row) + "\n")
            if (step + 1) % cfg.log_every == 0:
                bar.set_postfix(loss=f"{last_loss:.4f}")
            minutes = (time.time() - last_ckpt_time) / 60
            due = bool(cfg.checkpoint_every_steps and (step + 1) % cfg.checkpoint_every_steps == 0)
            due = due or bool(cfg.checkpoint_every_minutes and minutes > cfg.checkpoint_every_minutes)
            if due and step + 1 < cfg.steps:
                if env.is_main:  # DDP replicas are identical: rank 0 writes, everyone waits
                    checkpoint.save(ckpt_dir, step + 1, {
                        "step": step + 1, "model": model.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(), "rng": checkpoint.rng_state(),
                        "data": packer.state_dict(), "config": cfg.model_dump()}, cfg.keep_last)
                distributed.barrier(env)
                last_ckpt_time = time.time()
            if env.is_main:
                checkpoint.heartbeat(out / "heartbeat.json", step + 1, loss=last_loss)
    finally:
        stream.close()
    if env.is_main:
        save_final(out, model, mcfg.model_dump(), cfg, ds)
    return TrainResult(out, last_loss, first_loss, cfg.steps, start)


def _ddp_loss(ddp_model: torch.nn.Module, batch: PackedBatch, noise: torch.Tensor, u: torch.Tensor,
              denom: float, env: distributed.DistEnv) -> torch.Tensor:
    """Run the loss through DDP's forward so that its gradient hooks fire."""
    return ddp_model(batch, noise, u, denom / env.world_size)


def save_final(out: Path, model: torch.nn.Module, model_cfg: dict, cfg: TrainConfig, ds: V3Dataset) -> None:
    from safetensors.torch import save_file

    tmp = out / "model.safetensors.tmp"
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(tmp))
    tmp.replace(out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({"model": model_cfg, "train": cfg.model_dump()}, indent=2))
    st = ds.meta.stats or {}
    (out / "stats.json").write_text(json.dumps({k: {s: v.tolist() for s, v in st[k].items()}
                                                for k in (ds.state_key, ds.action_key) if k in st}, indent=2))
    plot_loss(out / "metrics.jsonl", out / "loss.png")


def plot_loss(metrics: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows])
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("flow-matching loss")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
