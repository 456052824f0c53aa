"""The training loop: build from a `TrainConfig`, resume if a checkpoint exists, train, save.

Outputs in `output_dir`: checkpoints/ (atomic, last k), heartbeat.json, metrics.jsonl (loss,
lr, samples/s, tokens/s, non-pad fraction, data-wait fraction, MFU), and at the end
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
from roboloop.training.model import VLAPolicy, num_parameters, train_flops
from roboloop.training.packing import PackedBatch
from roboloop.training.pipeline import BatchPipeline, Packer

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    pass


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
    sharded = cfg.strategy == "fsdp" and env.world_size > 1
    ddp_model = distributed.wrap(model, env, cfg.strategy)  # FSDP shards before the optimizer sees params
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, cfg))
    stream = SampleStream(ds, mcfg.image_size, mcfg.max_text_len, window=cfg.window,
                          shuffle_buffer=cfg.shuffle_buffer, num_workers=cfg.num_workers, seed=cfg.seed,
                          normalizer=norm, with_video=cfg.with_video, tokenizer=mcfg.tokenizer)
    start, ckpt_dir = 0, out / "checkpoints"
    found = checkpoint.latest(ckpt_dir) if cfg.resume else None
    if found is not None:
        if checkpoint.is_sharded(found):
            if not sharded:
                raise ValueError(f"{found} is an FSDP (DCP) checkpoint; resume it with strategy=fsdp on >1 rank")
            st = checkpoint.load_sharded(found, model, opt)
        else:
            st = checkpoint.load(found)
            if sharded:
                raise ValueError(f"{found} is a DDP checkpoint; resume it with strategy=ddp")
            model.load_state_dict(st["model"])
            opt.load_state_dict(st["optimizer"])
        _check_same_run(st.get("config", {}), cfg, found)
        sched.load_state_dict(st["scheduler"])
        checkpoint.set_rng_state(st["rng"])
        stream.load_state_dict(st["data"])
        start = int(st["step"])
        log.info("resumed from %s (step %d)", found, start)
    if env.is_main:  # which run owns the checkpoints here (read by orchestration without torch)
        (out / "run_config.json").write_text(cfg.model_dump_json(indent=2))
    packer = Packer(stream, cfg.max_tokens, cfg.max_samples, mcfg.tokens_per_image, env.world_size)
    pipe = BatchPipeline(packer, stream, env.rank, env.world_size, mcfg.tokens_per_image, device,
                         prefetch=cfg.prefetch)
    peak = precision.peak_flops(device, prec.name)
    log.info("model %s: %.2fM parameters, precision %s (%s), %s, device %s, rank %d/%d", cfg.preset,
             num_parameters(model) / 1e6, prec.name, prec.reason, cfg.strategy if env.world_size > 1 else "1 rank",
             device, env.rank, env.world_size)
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
            ready = pipe.next()
            wait = pipe.wait_s
            batch = ready.batch
            noise, u = flow_noise(ready.mine, step, cfg.seed, mcfg.horizon, mcfg.action_dim)
            with prec.autocast(device.type), precision.fp8_context(prec):
                # Each rank divides by the global count; DDP/FSDP average, so scale back by W.
                loss = model.loss(batch, noise=noise, u=u, denominator=ready.denominator) \
                    if env.world_size == 1 else _ddp_loss(ddp_model, batch, noise, u, ready.denominator, env)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            t_prep = time.perf_counter()
            pipe.prepare_next()  # decode + copy the next batch while the device works
            if device.type != "cuda":  # on CPU that work is not overlapped: it is data wait
                wait += time.perf_counter() - t_prep
            global_loss = distributed.all_reduce_sum(loss.detach() / env.world_size, env)
            if not torch.isfinite(global_loss):
                raise NonFiniteLossError(f"loss became {global_loss.item()} at step {step}; "
                                         "stopping without a final model")
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            last_loss = global_loss.item()
            dt = time.perf_counter() - t0
            if step == start:
                first_loss = last_loss
            if env.is_main:
                tokens = int(batch.seq_lens.sum())
                flops = train_flops(mcfg, batch.seq_lens.tolist(), int(batch.images.shape[0])) * env.world_size
                row = {"step": step + 1, "loss": last_loss, "lr": sched.get_last_lr()[0],
                       "samples_per_s": len(ready.keys) / dt, "tokens_per_s": tokens * env.world_size / dt,
                       "nonpad_fraction": tokens / cfg.max_tokens, "data_wait_fraction": min(1.0, wait / dt),
                       "mfu": flops / dt / (peak * env.world_size) if peak else None}
                with open(metrics_path, "a") as f:
                    f.write(json.dumps(row) + "\n")
            if (step + 1) % cfg.log_every == 0:
                bar.set_postfix(loss=f"{last_loss:.4f}")
            if env.is_main and bar.disable and (step + 1) % max(cfg.log_every, cfg.steps // 20) == 0:
                # no terminal (torchrun under Prefect): a plain line the parent can re-log
                print(f"step {step + 1}/{cfg.steps} loss {last_loss:.4f} {len(ready.keys) / dt:.0f} samples/s",
                      flush=True)
            minutes = (time.time() - last_ckpt_time) / 60
            due = bool(cfg.checkpoint_every_steps and (step + 1) % cfg.checkpoint_every_steps == 0)
            due = due or bool(cfg.checkpoint_every_minutes and minutes > cfg.checkpoint_every_minutes)
            # ranks' clocks differ: checkpoint when any rank says it is due
            due = bool(distributed.all_reduce_sum(torch.tensor(float(due), device=device), env) > 0)
            if due and step + 1 < cfg.steps:
                extra = {"step": step + 1, "scheduler": sched.state_dict(), "rng": checkpoint.rng_state(),
                         "data": pipe.state_dict(), "config": cfg.model_dump(mode="json")}
                if sharded:
                    checkpoint.save_sharded(ckpt_dir, step + 1, model, opt, extra, cfg.keep_last, env.rank,
                                            lambda: distributed.barrier(env))
                elif env.is_main:  # DDP replicas are identical: rank 0 writes, everyone waits
                    checkpoint.save(ckpt_dir, step + 1, {**extra, "model": model.state_dict(),
                                                         "optimizer": opt.state_dict()}, cfg.keep_last)
                distributed.barrier(env)
                last_ckpt_time = time.time()
            if env.is_main:
                checkpoint.heartbeat(out / "heartbeat.json", step + 1, loss=last_loss)
    finally:
        stream.close()
    weights = distributed.full_state_dict(model, sharded)
    if env.is_main:
        save_final(out, weights, mcfg.model_dump(), cfg, ds)
    return TrainResult(out, last_loss, first_loss, cfg.steps, start)


def _check_same_run(saved: dict, cfg: TrainConfig, found: Path) -> None:
    changed = cfg.changed_fields(saved)
    if changed:
        raise ValueError(f"{found} belongs to a run with different {', '.join(changed)}; resuming would mix two "
                         "runs: use another output_dir, or resume=False to start over")


def _ddp_loss(ddp_model: torch.nn.Module, batch: PackedBatch, noise: torch.Tensor, u: torch.Tensor,
              denom: float, env: distributed.DistEnv) -> torch.Tensor:
    """Run the loss through the wrapper's forward so that DDP's / FSDP's hooks fire."""
    return ddp_model(batch, noise, u, denom / env.world_size)


def save_final(out: Path, weights: dict[str, torch.Tensor], model_cfg: dict, cfg: TrainConfig,
               ds: V3Dataset) -> None:
    from safetensors.torch import save_file

    tmp = out / "model.safetensors.tmp"
    save_file(weights, str(tmp))
    tmp.replace(out / "model.safetensors")
    data = {"state_key": ds.state_key, "action_key": ds.action_key, "video_keys": list(ds.video_keys),
            "fps": ds.meta.info.fps, "with_video": cfg.with_video}
    (out / "config.json").write_text(json.dumps({"model": model_cfg, "train": cfg.model_dump(), "data": data},
                                                indent=2))
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
