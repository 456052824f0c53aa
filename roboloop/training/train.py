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
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from roboloop import fsutil, policies
from roboloop.datasets.layout import ENV_STATE
from roboloop.training import (
    checkpoint,
    compiled,
    distributed,
    ema,
    finetune,
    hang,
    hostmem,
    metrics,
    optim,
    outdir,
    precision,
    recompute,
    runstore,
)
from roboloop.training.config import TrainConfig
from roboloop.training.data import Normalizer, SampleStream, V3Dataset
from roboloop.training.model import num_parameters
from roboloop.training.pipeline import BatchPipeline, Packer, Ready
from roboloop.training.resume import agreed_checkpoint
from roboloop.training.runfiles import (  # noqa: F401  (sample_order: the tests ask it here)
    camera_line,
    env_state_line,
    features_of,
    init_depth_ranges,
    sample_order,
    save_final,
)
from roboloop.training.split import split_episodes

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    pass


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
    if cfg.lr_schedule == "constant":
        return 1.0
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train(cfg: TrainConfig, overwrite: bool = False) -> TrainResult:
    """Train (or resume) into `cfg.output_dir`, which must be free or this run's (see `outdir`).

    Under torchrun the parent (`run_torchrun`) has already planned, claimed and locked the folder: ranks
    only check it, they never move anything aside. Otherwise this process locks it for the whole run: a
    second run into the same folder at the same time is refused, naming the first one's pid."""
    if "LOCAL_RANK" in os.environ:
        return _plan_and_train(cfg, overwrite, ranked=True)
    out = Path(cfg.output_dir).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    with fsutil.exclusive(fsutil.lock_path_for(out), f"training folder {out}"):
        return _plan_and_train(cfg, overwrite, ranked=False)


def _plan_and_train(cfg: TrainConfig, overwrite: bool, ranked: bool) -> TrainResult:
    outdir.check_init_from(cfg.init_from)
    fingerprint = outdir.dataset_fingerprint(cfg.dataset)
    plan = outdir.plan(cfg, fingerprint, overwrite=overwrite and not ranked)
    if plan.action == "finished":
        return finished_result(Path(cfg.output_dir), cfg.steps)
    env = distributed.init(cfg.device)
    try:
        if env.is_main:
            outdir.claim(Path(cfg.output_dir), cfg, fingerprint)
        return _train(cfg, env)
    finally:
        distributed.shutdown()


def finished_result(out: Path, steps: int) -> TrainResult:
    """The result of a run that already finished in `out` (nothing is retrained or rewritten)."""
    rows = metrics.read_rows(out)
    if not rows:
        raise outdir.OutputOwnershipError(f"{out} has a model but no metrics.jsonl; choose another --output-dir")
    return TrainResult(out, rows[-1]["loss"], rows[0]["loss"], steps, steps)


def _train(cfg: TrainConfig, env: distributed.DistEnv) -> TrainResult:
    return Trainer(cfg, env).run()


class Trainer:
    """Named steps, torchtitan style: build, resume, then for each step forward/backward, log, checkpoint."""

    def __init__(self, cfg: TrainConfig, env: distributed.DistEnv):
        self.cfg, self.env = cfg, env
        self.t0 = time.monotonic()  # this (re)start's clock: every metrics row's elapsed_s counts from here
        self.out = Path(cfg.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = env.device
        host_memory = hostmem.apply(cfg.host_memory, self.device.type)  # before the dataset and the model
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True)
        torch.manual_seed(cfg.seed)  # same initial weights on every rank
        self.order = self._build_policy()
        pol, needs = self.policy, self.policy.needs
        blocks = compiled.regions(self.model)  # compiled after FP8's conversion, before the wrap
        self.compiling, why = compiled.plan(cfg.compile, getattr(pol, "kind", cfg.family), self.device.type,
                                            bool(blocks))
        self.prec = precision.plan(cfg.precision, self.device.type, cfg.fp8_backend,
                                   torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
                                   compiled=self.compiling)
        self.prec = precision.fit(self.prec, cfg.precision, getattr(pol, "fp32_only", None))
        norm, self.tuned = self._normalizer(), finetune.apply(pol, cfg)  # LoRA etc. after init_from's weights
        self._settle_precision(blocks, why)
        self.ddp_model = self._wrap(blocks)
        self.opt, self.run_record["optimizer"] = optim.adamw(self.model.parameters(), cfg.lr, cfg.weight_decay)
        self.run_record["parameters"] = {**optim.counts(self.model), "finetune": self.tuned}
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: lr_at(s, cfg))
        self.stream = self._stream(norm)
        self.run_record["frame_cache"] = self.stream.cache_record()
        self.run_record["host_memory"] = host_memory
        self.ckpt_dir = self.out / "checkpoints"
        if cfg.ema_decay and self.sharded:
            raise ValueError(f"ema_decay with strategy={cfg.strategy} on more than one rank is not supported yet (the "
                             "average would have to be sharded like the weights): use strategy=ddp or ema_decay=0")
        self.ema = ema.WeightAverage(self.model, cfg.ema_decay) if cfg.ema_decay else None
        # rank 0 pushes each checkpoint to the run's mirror (S3) beside training; where FSDP's nodes write their
        # shards apart (no shared folder: a run store), each node's first rank pushes its node's part
        self.apart = self.sharded and bool(cfg.mirror) and distributed.nodes(env) > 1
        lead = env.is_main
        self.pusher = runstore.Pusher(runstore.Mirror(cfg.mirror), cfg.keep_last, lead=lead, coalesce=not self.apart) \
            if cfg.mirror and (lead or self.apart and env.local_rank == 0) else None
        self.start = self.resume()
        self.beat = hang.watched(self.out, env.rank, env.world_size)  # a rank hung in a step is found and killed
        self.run_record["sample_order"] = self.stream.order_record()  # after resume: a run keeps its order
        # a family that packs no backbone tokens (LeRobot's policies) takes max_samples per batch, whatever the
        # length of its task strings
        # one pack per optimizer step, for world_size x accumulate slots (each a rank's micro-batch)
        packer = Packer(self.stream, cfg.max_tokens if needs.token_budget else 2**62, cfg.max_samples,
                        needs.tokens_per_image, env.world_size * cfg.accumulate)
        self.pipe = BatchPipeline(packer, self.stream, env.rank, env.world_size, needs.tokens_per_image, self.device,
                                  prefetch=cfg.prefetch,
                                  lookahead=None if cfg.lookahead == "auto" else cfg.lookahead == "on",
                                  accumulate=cfg.accumulate)
        self.peak = precision.peak_flops(self.device, self.prec.name)
        self.run_record["mfu_peak"] = precision.peak_record(self.device, self.prec.name)
        self.metrics_path = self.out / "metrics.jsonl"
        self.last_ckpt_time = time.time()
        log.info("%s %s: %.2fM parameters, precision %s (%s), %s, device %s, rank %d/%d", cfg.family, cfg.preset,
                 num_parameters(self.model) / 1e6, self.prec.name, self.prec.reason,
                 cfg.strategy if env.world_size > 1 else "1 rank", self.device, env.rank, env.world_size)
        if env.is_main:
            self._announce()

    def _build_policy(self) -> str:
        """The dataset, the family's trainable model for it, and the episodes it trains on; returns the sample
        order (decided before anything is built from the data)."""
        cfg, env = self.cfg, self.env
        self.family = policies.family(cfg.family)
        # observation.environment_state as an input: a family that reads it, unless the recipe leaves it out
        self.reads_env_state = "env_state" in self.family.capabilities
        env_key = ENV_STATE if self.reads_env_state and cfg.env_state_input != "off" else None
        self.ds = ds = V3Dataset(cfg.dataset, aux_key=cfg.aux_target if cfg.with_video else None, env_key=env_key)
        for name, why in getattr(self.family, "unread_settings", {}).items():  # a family of one's own says so too
            if getattr(cfg, name) != type(cfg).model_fields[name].get_default(call_default_factory=True):
                raise ValueError(f"{name}={getattr(cfg, name)!r} would do nothing: {why}")
        self.policy = pol = self.family.build(cfg, features_of(ds, cfg.with_video))
        needs = pol.needs
        one_rank_only = getattr(pol, "one_rank_only", None)  # why this policy cannot train on several ranks
        if env.world_size > 1 and one_rank_only:
            raise ValueError(f"{env.world_size} ranks: {one_rank_only}")
        self.model = pol.module
        ds.horizon = needs.horizon
        self.with_video = cfg.with_video and needs.cameras
        order = sample_order(cfg, self.with_video)  # before anything is built from the data
        self.train_episodes, self.val_episodes = split_episodes([e.episode_index for e in ds.meta.episodes],
                                                                cfg.val_fraction, cfg.seed)
        return order

    def _normalizer(self) -> Normalizer:
        """The normalisation it trains with: the dataset's stats, or those of the model it continues from."""
        cfg, ds, pol, needs = self.cfg, self.ds, self.policy, self.policy.needs
        self.depth_mm = ds.depth_ranges(ds.meta.dataset_stats()) if self.with_video else {}
        if cfg.init_from:
            self.stats = self.family.load_init(pol, Path(cfg.init_from), [ds.state_key, ds.action_key])
            self.depth_mm.update(init_depth_ranges(Path(cfg.init_from)))  # the scaling its weights learnt
        else:
            st = ds.meta.dataset_stats()
            self.stats = {k: {s: v.tolist() for s, v in st[k].items()} for k in (ds.state_key, ds.action_key)
                          if k in st}
        norm = Normalizer.from_stats(self.stats, [ds.state_key, ds.action_key], ds.root)
        if ds.aux_key and needs.normalized:  # a training target only: this dataset's stats, not stored with the model
            aux_norm = Normalizer.from_meta(ds.meta, [ds.aux_key])
            norm.mean[ds.aux_key], norm.std[ds.aux_key] = aux_norm.mean[ds.aux_key], aux_norm.std[ds.aux_key]
        return norm

    def _settle_precision(self, blocks: list, why: str) -> None:
        """On the device: FP8 where it pays (and is asked for), the kernels, the compiled regions; the run record."""
        cfg, env, pol = self.cfg, self.env, self.policy
        self.model.to(self.device)
        threshold, source = precision.fp8_threshold(self.device, self.compiling)
        self.prec, fp8_names = precision.settle(self.prec, self.model, threshold, f"preset {cfg.preset}",
                                                explicit=cfg.precision == "fp8")
        self.prec.fp8_recipe = cfg.fp8_recipe
        self.sharded = cfg.strategy in ("fsdp", "hsdp") and env.world_size > 1
        self.fp8_gather, gather_why = precision.fp8_all_gather(self.prec, self.sharded, cfg.fp8_recipe)
        precision.apply_fp8(self.model, self.prec, threshold, recipe=cfg.fp8_recipe, all_gather=self.fp8_gather)
        half = self.prec.name in ("bf16", "fp8") and self.device.type == "cuda"
        dtype = torch.bfloat16 if half else torch.float32
        kernels: dict = getattr(pol, "kernels", lambda *_: {})(self.device.type, dtype)
        self.run_record = precision.run_record(cfg.precision, self.prec, fp8_names, threshold, source, self.device,
                                               kernels)
        self.run_record["fp8_all_gather"] = gather_why
        types = len({type(b) for b in blocks}) if self.compiling else 0
        self.run_record["compile"] = compiled.record(cfg.compile, self.compiling, why,
                                                     compiled.apply(self.model) if self.compiling else 0, types)

    def _wrap(self, blocks: list) -> torch.nn.Module:
        """Activation checkpointing in the blocks, then DDP or FSDP2 across the ranks with the gradients' dtype on the
        wire (before the optimizer: FSDP shards first; a model fed no images leaves its image path idle)."""
        cfg, env = self.cfg, self.env
        if cfg.activation_checkpointing:
            if not blocks:
                raise ValueError(f"activation_checkpointing would do nothing: {type(self.model).__name__} has no "
                                 "blocks (compile_regions() nor blocks) to recompute")
            self.run_record["activation_checkpointing"] = {"blocks": recompute.apply(blocks)}
        if cfg.grad_reduce != "fp32" and env.world_size == 1:
            raise ValueError(f"grad_reduce {cfg.grad_reduce} would do nothing: one rank sends no gradients (set "
                             "grad_reduce fp32, or train on several ranks)")
        self.run_record["gradients"] = {"reduce_dtype": cfg.grad_reduce, "accumulate": cfg.accumulate,
                                        "ranks": env.world_size}
        return distributed.wrap(self.model, env, cfg.strategy, idle_params=not self.with_video,
                                grad_reduce=cfg.grad_reduce)

    def _stream(self, norm: Normalizer) -> SampleStream:
        """The training samples: the split's episodes in the sample order, decoded and cached as the family needs."""
        cfg, ds, needs, order = self.cfg, self.ds, self.policy.needs, self.order
        return SampleStream(ds, needs.image_size, needs.max_text_len, window=cfg.window,
                            shuffle_buffer=cfg.shuffle_buffer, num_workers=cfg.num_workers, seed=cfg.seed,
                            normalizer=norm if needs.normalized else None,  # else the family's own
                            with_video=self.with_video, tokenizer=needs.tokenizer,
                            state_tokens=needs.state_tokens, episodes=self.train_episodes,
                            depth_mm=self.depth_mm,
                            cameras=list(needs.camera_keys) if needs.camera_keys is not None else None,
                            history=needs.history, drop_last=needs.drop_last, cache_mb=cfg.frame_cache_mb,
                            env_state=needs.env_state, order=order)

    def _announce(self) -> None:
        """The run's settings, in the run log beside the loss lines."""
        ds, needs, cfg = self.ds, self.policy.needs, self.cfg
        print(camera_line(ds, self.with_video, needs.camera_keys), flush=True)
        if ENV_STATE in ds.meta.info.features and self.reads_env_state:
            print(env_state_line(ds, needs.env_state, cfg.env_state_input), flush=True)
        print(precision.record_line(self.run_record), flush=True)
        print(self.stream.cache_line(), flush=True)
        print(self.stream.order_line(), flush=True)
        print(f"host memory: {self.run_record['host_memory']}", flush=True)
        print(f"optimizer: {self.run_record['optimizer']}; {optim.trained(self.run_record['parameters'])}", flush=True)
        print(f"compile: {self.run_record['compile']['why']}", flush=True)
        g = self.run_record["gradients"]
        print(f"gradients: {g['accumulate']} micro-batch(es) per step on {g['ranks']} rank(s), reduced in "
              f"{g['reduce_dtype']}", flush=True)


    def resume(self) -> int:
        """Load the latest checkpoint (model, optimizer, scheduler, RNG, data position); returns its step."""
        cfg = self.cfg
        found = agreed_checkpoint(self.ckpt_dir, self.env, cfg.mirror, cfg.keep_last) if cfg.resume else None
        if found is None:
            return 0
        if checkpoint.is_sharded(found):  # DCP reshards: any number of ranks (and nodes) resumes it
            if self.ema is not None:
                raise ValueError(f"{found} is an FSDP (DCP) checkpoint, which keeps no weight average: resume it "
                                 "with ema_decay=0")
            st = checkpoint.load_sharded(found, self.model, self.opt)
        else:
            st = checkpoint.load(found)
            if self.sharded:
                raise ValueError(f"{found} is a DDP checkpoint; resume it with strategy=ddp")
            self.model.load_state_dict(st["model"])
            self.opt.load_state_dict(st["optimizer"])
            if self.ema is not None:  # the run's average goes on; a checkpoint without one starts it here
                if st.get("ema"):
                    self.ema.load_state_dict(st["ema"])
                else:
                    self.ema = ema.WeightAverage(self.model, self.cfg.ema_decay)
        _check_same_run(st.get("config", {}), self.cfg, found)
        _check_same_slots(st.get("slots"), self.env.world_size, self.cfg.accumulate, found)
        self.sched.load_state_dict(st["scheduler"])
        checkpoint.set_rng_state(st["rng"])
        self.stream.load_state_dict(st["data"])
        log.info("resumed from %s (step %d)", found, int(st["step"]))
        return int(st["step"])

    def run(self) -> TrainResult:
        cfg, env = self.cfg, self.env
        if env.is_main and self.metrics_path.exists():  # drop rows a killed run wrote after its last checkpoint
            keep = [r for r in metrics.read_rows(self.out) if r["step"] <= self.start]
            fsutil.atomic_write_text(self.metrics_path, "".join(json.dumps(r) + "\n" for r in keep))
        first_loss = last_loss = float("nan")
        bar = tqdm(range(self.start, cfg.steps), initial=self.start, total=cfg.steps, desc="train",
                   disable=None if env.is_main else True)
        try:
            for step in bar:
                last_loss, row = self._watched_step(step)
                if step == self.start:  # each (re)start's first row says what ran
                    first_loss, row["run"] = last_loss, self.run_record
                    row["pipeline"] = {"prefetch": self.pipe.prefetch, "lookahead": self.pipe.lookahead}
                self.log(step, last_loss, row, bar)
                self.maybe_checkpoint(step)
                if env.is_main:
                    checkpoint.heartbeat(self.out / "heartbeat.json", step + 1, loss=last_loss)
        except BaseException:
            if self.pusher:  # the checkpoints written reach the store before the rank goes: a retry resumes there
                self.pusher.wait()
            raise
        finally:
            self.stream.close()
            if self.beat:
                self.beat.close()
        weights = distributed.full_state_dict(self.model, self.sharded)
        avg = ema.averaged(weights, self.ema.state_dict() if self.ema else None)
        weights = finetune.merged(precision.plain_state_dict(avg), cfg)  # LoRA's adapters merged in
        weights = getattr(self.family, "weights", lambda sd: sd)(weights)  # as the family's folder names them
        if env.is_main:
            save_final(self.out, weights, self.family, self.policy, cfg, self.ds, self.stats,
                       {"train_episodes": self.train_episodes, "validation_episodes": self.val_episodes},
                       self.depth_mm, self.with_video, self.run_record)
        if self.pusher:  # after the last collective: the other ranks never wait on the store
            self.pusher.wait()
        return TrainResult(self.out, last_loss, first_loss, cfg.steps, self.start)

    def _watched_step(self, step: int) -> tuple[float, dict]:
        """`train_step` inside this rank's heartbeat (its node's other ranks kill it if it hangs there)."""
        if self.beat:
            self.beat.enter(step)
        out = self.train_step(step)
        if self.beat:
            self.beat.leave(step)
        return out

    def _micro_batches(self, step: int) -> tuple[torch.Tensor, Ready, int, float | None, float]:
        """The step's forward and backward passes, one per micro-batch (`accumulate`), gradients summed and
        synchronised across ranks at the last only; the next micro-batch is prepared meanwhile. Returns this rank's
        loss summed over them, the last micro-batch, their tokens and FLOPs, and the time spent waiting for data."""
        env, device, n = self.env, self.device, self.cfg.accumulate
        wrapped = self.model if env.world_size == 1 else self.ddp_model
        loss_sum, tokens, wait = torch.zeros((), device=device), 0, 0.0
        flops: float | None = 0.0
        for micro in range(n):
            ready = self.pipe.next()
            wait += self.pipe.wait_s
            assert ready.micro == micro, "micro-batches out of step with their pack"
            # Each rank divides by the global pack's count; DDP/FSDP average, so scale back by W; the micro-batches'
            # gradients add up to the pack's. The wrapper's forward is the loss, so DDP's / FSDP's hooks fire.
            inputs = self.policy.loss_inputs(ready.batch, ready.mine, step, ready.denominator / env.world_size)
            with distributed.gradient_sync(wrapped, env, micro == n - 1):
                with self.prec.autocast(device.type), precision.fp8_context(self.prec):
                    loss = wrapped(*inputs)
                loss.backward()
            loss_sum += loss.detach()
            tokens += int(ready.batch.seq_lens.sum())
            f = self.policy.flops(ready.batch)
            flops = flops + f if f is not None and flops is not None else None
            t_prep = time.perf_counter()
            self.pipe.prepare_next()  # decode + copy the next batch while the device works
            if device.type != "cuda":  # on CPU that work is not overlapped: it is data wait
                wait += time.perf_counter() - t_prep
        return loss_sum, ready, tokens, flops, wait

    def train_step(self, step: int) -> tuple[float, dict]:
        """One optimizer step on the next packed batch (in `accumulate` micro-batches)."""
        cfg, env = self.cfg, self.env
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss, ready, tokens, flops, wait = self._micro_batches(step)
        global_loss = distributed.all_reduce_sum(loss / env.world_size, env)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        if self.fp8_gather:
            precision.after_optimizer_step(self.model)
        self.sched.step()
        if self.ema is not None:
            self.ema.update()
        # the step's one wait for the device (the clip and the update were queued behind the backward pass);
        # a non-finite loss stops the run here, before its weights can reach a checkpoint or the final model
        value = global_loss.item()
        if not math.isfinite(value):
            raise NonFiniteLossError(f"loss became {value} at step {step}; stopping without a final model")
        dt = time.perf_counter() - t0
        row = {"step": step + 1, "loss": value, "lr": self.sched.get_last_lr()[0],
               "samples_per_s": len(ready.keys) / dt, "tokens_per_s": tokens * env.world_size / dt,
               "nonpad_fraction": tokens / cfg.max_tokens / cfg.accumulate, "data_wait_fraction": min(1.0, wait / dt),
               # the loop's own time building the next batch (on CUDA overlapped with the GPU's queued work;
               # on CPU it is data wait too)
               "data_build_fraction": min(1.0, self.pipe.build_s / dt),
               "mfu": flops / dt / self.peak if self.peak and flops is not None else None,
               **self.policy.extra_metrics()}
        return value, row

    def log(self, step: int, loss: float, row: dict, bar: tqdm) -> None:
        cfg = self.cfg
        row["elapsed_s"] = round(time.monotonic() - self.t0, 2)  # since this process started building the run
        if self.compiling:  # compiled graphs so far: a recompile after the first steps is a shape compiled again
            c = compiled.update(self.run_record["compile"])
            row["compile"] = {k: c[k] for k in ("graphs", "recompiles", "graph_breaks")}
        if self.env.is_main:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
        if (step + 1) % cfg.log_every == 0:
            bar.set_postfix(loss=f"{loss:.4f}")
        if self.env.is_main and bar.disable and (step + 1) % max(cfg.log_every, cfg.steps // 20) == 0:
            # no terminal (torchrun under Prefect): a plain line the parent can re-log
            print(f"step {step + 1}/{cfg.steps} loss {loss:.4f} {row['samples_per_s']:.0f} samples/s", flush=True)

    def maybe_checkpoint(self, step: int) -> None:
        cfg, env = self.cfg, self.env
        minutes = (time.time() - self.last_ckpt_time) / 60
        due = bool(cfg.checkpoint_every_steps and (step + 1) % cfg.checkpoint_every_steps == 0)
        due = due or bool(cfg.checkpoint_every_minutes and minutes > cfg.checkpoint_every_minutes)
        # ranks' clocks differ: checkpoint when any rank says it is due
        due = bool(distributed.all_reduce_sum(torch.tensor(float(due), device=self.device), env) > 0)
        if not due or step + 1 >= cfg.steps:
            return
        t0 = time.monotonic()
        extra = {"step": step + 1, "slots": env.world_size * cfg.accumulate, "scheduler": self.sched.state_dict(),
                 "rng": checkpoint.rng_state(),
                 "data": self.pipe.state_dict(), "config": cfg.model_dump(mode="json")}
        saved = None
        if self.sharded or cfg.strategy != "ddp" and self.ema is None:  # one fsdp rank too: DCP, which reshards
            saved = checkpoint.save_sharded(self.ckpt_dir, step + 1, self.model, self.opt, extra, cfg.keep_last,
                                            env.rank, lambda: distributed.barrier(env), env.local_rank,
                                            (lambda mine: distributed.all_gather_json(mine, env))
                                            if self.apart else None)
        elif env.is_main:  # DDP replicas are identical: rank 0 writes, everyone waits
            saved = checkpoint.save(self.ckpt_dir, step + 1, {**extra, "model": self.model.state_dict(),
                                                              "optimizer": self.opt.state_dict(),
                                                              **({"ema": self.ema.state_dict()} if self.ema else {})},
                                    cfg.keep_last)
        if self.pusher and saved is not None:
            self.pusher.submit(saved)  # queued: this rank goes on at once, however slow the store
        distributed.barrier(env)
        self.last_ckpt_time = time.time()
        _check_save_time(time.monotonic() - t0, step + 1, env.is_main)


def _check_save_time(took: float, step: int, main: bool) -> None:
    """The other ranks wait at the barrier while a checkpoint is written: past collective_timeout_s they fail as if a
    node were lost. Said when a save takes half of it (raise ROBOLOOP_COLLECTIVE_TIMEOUT_S, or write less)."""
    limit = float(os.environ.get("ROBOLOOP_COLLECTIVE_TIMEOUT_S", "600"))
    if main and took > limit / 2:
        log.warning("checkpoint step %d took %.0f s to write while the other ranks waited; collective_timeout_s=%g "
                    "must stay well above it (ROBOLOOP_COLLECTIVE_TIMEOUT_S) or a slower save fails the run", step,
                    took, limit)


def _check_same_slots(saved: int | None, world: int, accumulate: int, found: Path) -> None:
    """The data goes on as it went only with as many slots per pack (ranks x accumulate): 2 ranks resume on 1 with
    accumulate doubled, and the run is the run it was."""
    if saved is not None and saved != world * accumulate:
        fits = f"accumulate {saved // world}" if saved % world == 0 else f"ranks x accumulate = {saved}"
        raise ValueError(f"{found} was written by a run of {saved} data slots per step (ranks x accumulate); this one "
                         f"has {world} x {accumulate}: resume with {fits}, or in another output_dir")


def _check_same_run(saved: dict, cfg: TrainConfig, found: Path) -> None:
    changed = cfg.changed_fields(saved)
    if changed:
        raise ValueError(f"{found} belongs to a run with different {', '.join(changed)}; resuming would mix two "
                         "runs: use another output_dir, or resume=False to start over")
