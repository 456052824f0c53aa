"""Scale on paper: step time and scaling efficiency of the `base` and `n15` presets from 8 to 1,024 GPUs.

    python bench/scale.py [--presets base n15] [--max-tokens 8192] [--mfu 0.35] [--gpu-step-ms n15=412 ...]
                          [--measure base] [--markdown]

What is measured, here: each preset's trainable parameters and so its gradient bytes (fp32 gradients, what DDP
all-reduces; FSDP2 gathers fp32 parameters and reduce-scatters fp32 gradients); the model FLOPs of one packed batch
of `--max-tokens` tokens per GPU (`train_flops`, the trainer's MFU count); with `--measure P`, the forward+backward
time of preset P on this machine's CPU and its achieved FLOP/s (a proxy: it checks the FLOP count against a
clock, it does not predict a GPU).

What is assumed, and where it comes from (every figure is a flag):
- GPU compute per step = FLOPs / (peak x MFU): H100 SXM dense BF16 peak 989 TFLOP/s (NVIDIA's H100 datasheet), MFU
  0.35 unless `--gpu-step-ms` gives a step time measured on the GPU (`bench/precision.py` prints it).
- Network, alpha-beta: 8 GPUs per node on NVLink 4 (900 GB/s per GPU both ways, 450 one way; datasheet) and one
  400 Gb/s InfiniBand NDR NIC per GPU between nodes (a DGX H100 has eight ConnectX-7: 3.2 Tb/s per node, the
  network of the thousand-GPU LeRobot platform, arXiv 2603.11101). NCCL reaches `--link-efficiency` 0.9 of a
  link's rate in bus bandwidth (nccl-tests' busbw: algbw x 2(n-1)/n for all-reduce, comparable with the link's
  peak; doc/PERFORMANCE.md). Latency per step of a collective: 2 us on NVLink, 6 us across nodes.
- All-reduce of S bytes over p GPUs: ring 2(p-1)a + 2(p-1)/p S/B; tree (NCCL's double binary tree)
  2 log2(p) a + 2 S/B; the faster of the two (NCCL chooses per size). B: NVLink's within one node, the NIC's
  beyond.
- DDP overlaps the all-reduce with the backward pass (2/3 of compute), except the last 25 MB bucket.
  FSDP2 gathers parameters during forward (1/3) and again during backward, where it also reduce-scatters
  gradients; what does not fit under the compute it overlaps is exposed. HSDP does FSDP2's gathers and
  reduce-scatters inside a node (NVLink) and all-reduces each GPU's 1/8 shard of the gradients across nodes.
- Weak scaling (fixed per-GPU batch): efficiency = compute time / step time.
- Data: each node must deliver 8 x samples-per-GPU-batch per step, two camera frames each.

Baseline: the compute time of one GPU (no communication), so efficiency 1.0 is perfect scaling. The thousand-GPU
platform reports 92% communication efficiency and GR00T-N1.5 training from 15 h to 22 min (arXiv 2603.11101);
the JSON line carries both for comparison with this projection at 1,024 GPUs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from roboloop.training.config import PRESETS
from roboloop.training.model import VLAPolicy, train_flops
from roboloop.training.packing import Sample, pack
from roboloop.training.scalemodel import network, project

GPUS = [8, 16, 32, 64, 128, 256, 512, 1024]
PUBLISHED = {"source": "arXiv 2603.11101 (thousand-GPU LeRobot platform)", "communication_efficiency": 0.92,
             "gr00t_n15_hours_before": 15.0, "gr00t_n15_minutes_after": 22.0}

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/scale.py", "roboloop/training", "roboloop/policies"]


def synthetic_batch(cfg, max_tokens: int):
    """A packed batch as training forms it: two camera images and 16-64 instruction tokens per sample."""
    g = torch.Generator().manual_seed(0)
    h, w = cfg.image_size
    samples = [Sample([torch.zeros(3, 1, 1), torch.zeros(3, 1, 1)],
                      torch.randint(0, 256, (int(torch.randint(16, 65, (1,), generator=g)),), generator=g),
                      torch.zeros(cfg.state_dim), torch.zeros(cfg.horizon, cfg.action_dim),
                      torch.ones(cfg.horizon, dtype=torch.bool)) for _ in range(2048)]
    b = next(pack(samples, max_tokens, cfg.tokens_per_image))
    return b, (h, w)


def model_facts(preset: str, max_tokens: int) -> dict:
    cfg = PRESETS[preset]()
    with torch.device("meta"):  # counted, not allocated: n15 would need ~24 GB with its gradients and Adam
        model = VLAPolicy(cfg)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    b, _ = synthetic_batch(cfg, max_tokens)
    flops = train_flops(cfg, b.seq_lens.tolist(), 2 * len(b.seq_lens))
    return {"params": params, "flops_per_gpu_step": flops,
            "samples_per_gpu_step": len(b.seq_lens), "tokens_per_gpu_step": int(b.seq_lens.sum())}


def measure_cpu(preset: str, max_tokens: int, steps: int = 2) -> dict:
    """Forward + backward of `preset` on this CPU (no optimizer: its state is not what is timed)."""
    cfg = PRESETS[preset]()
    torch.manual_seed(0)
    model = VLAPolicy(cfg)
    g = torch.Generator().manual_seed(0)
    h, w = cfg.image_size
    samples = [Sample([torch.rand(3, h, w, generator=g) for _ in range(2)],
                      torch.randint(0, 256, (int(torch.randint(16, 65, (1,), generator=g)),), generator=g),
                      torch.randn(cfg.state_dim, generator=g), torch.randn(cfg.horizon, cfg.action_dim, generator=g),
                      torch.ones(cfg.horizon, dtype=torch.bool)) for _ in range(64)]
    b = next(pack(samples, max_tokens, cfg.tokens_per_image))
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        model.loss(b).backward()
        times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=False)
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    dt = min(times[1:])
    flops = train_flops(cfg, b.seq_lens.tolist(), int(b.images.shape[0]))
    return {"preset": preset, "max_tokens": max_tokens, "cpu_step_s": round(dt, 3), "grad_bytes_measured": grad_bytes,
            "achieved_gflops": round(flops / dt / 1e9, 1), "threads": torch.get_num_threads()}


def sent_bytes(params: int, strategy: str, grad_reduce: str, p: int, root_params: int = 0,
               backend: str = "nccl") -> float:
    """What one optimizer step's collectives send, summed over the `p` ranks (the model's count behind the times
    above): DDP all-reduces the gradients once (ring: 2(p-1)/p of them per rank); FSDP2 all-gathers the fp32
    parameters of each block in the forward and again in the backward pass (the root's `root_params`, outside the
    blocks, stay gathered between them: once) and reduce-scatters the gradients ((p-1)/p of each per rank; gloo has
    no reduce-scatter of its own and all-reduces instead, twice the bytes). Gradients in bf16 are half the bytes.
    Accumulation does not change it: one synchronisation per step."""
    grads = params * (2 if grad_reduce == "bf16" else 4)
    if strategy == "ddp":
        per_rank = 2 * (p - 1) / p * grads
    else:
        gathered = 4 * (2 * (params - root_params) + root_params)
        per_rank = (p - 1) / p * (gathered + grads * (2 if backend == "gloo" else 1))
    return p * per_rank


def recommended(facts: dict, step_s: float, p: int, net: dict, target: float = 0.9) -> dict:
    """The settings a user can set (`train.strategy`, `train.grad_reduce`, `train.accumulate` up to 16) that reach
    `target` efficiency on `p` GPUs with the fewest micro-batches (the smallest change to the global batch), the
    most efficient of those; the most efficient of all where none reaches it."""
    tried = []
    for accumulate in (1, 2, 4, 8, 16):
        for reduce, per_param in (("bf16", 2), ("fp32", 4)):
            row = project(facts, step_s, p, net, accumulate, per_param * facts["params"])
            for strategy, key in (("ddp", "ddp"), ("fsdp", "fsdp2"), ("hsdp", "hsdp")):
                tried.append(({"strategy": strategy, "grad_reduce": reduce, "accumulate": accumulate},
                              row[key]["efficiency"]))
    reaching = [t for t in tried if t[1] >= target]
    if reaching:
        fewest = min(t[0]["accumulate"] for t in reaching)
        best = max((t for t in reaching if t[0]["accumulate"] == fewest), key=lambda t: t[1])
    else:
        best = max(tried, key=lambda t: t[1])
    settings, eff = best
    return {"settings": settings, "efficiency_at_max": eff, "gpus": p, "target": target,
            "samples_per_optimizer_step": settings["accumulate"] * facts["samples_per_gpu_step"] * p}


def tokens_for(target: float, facts: dict, step_s: float, p: int, net: dict, tokens: int) -> int | None:
    """Tokens per GPU per step (compute taken as proportional to them) at which DDP reaches `target` efficiency on
    `p` GPUs; None beyond 2**22."""
    t = tokens
    while t <= 2**22:
        if project(facts, step_s * t / tokens, p, net)["ddp"]["efficiency"] >= target:
            return t
        t = int(t * 1.25)
    return None


def dominates(rows: list[dict], key: str) -> dict:
    """The first GPU counts where communication exceeds 10% of the step, and where it exceeds compute."""
    def first(limit: float) -> int | None:
        return next((r["gpus"] for r in rows if r[key]["efficiency"] < limit), None)
    return {"over_10_percent_at": first(1 / 1.1), "over_compute_at": first(0.5)}


def recommended_line(r: dict) -> str:
    s = r["settings"]
    return (f"Recommended at {r['gpus']} GPUs: `strategy {s['strategy']}, grad_reduce {s['grad_reduce']}, accumulate "
            f"{s['accumulate']}`, projected efficiency {r['efficiency_at_max']:.1%} "
            f"({r['samples_per_optimizer_step']:,} samples per optimizer step).")


def markdown(out: dict) -> str:
    lines = []
    for preset, d in out["presets"].items():
        lines += [f"**{preset}**: {d['params'] / 1e9:.2f} B parameters, {d['grad_bytes'] / 1e9:.2f} GB of fp32 "
                  f"gradients, {d['flops_per_gpu_step'] / 1e12:.1f} TFLOP per GPU step ({d['samples_per_gpu_step']} "
                  f"samples, {d['tokens_per_gpu_step']} tokens), compute {d['compute_ms']:.0f} ms "
                  f"({d['compute_source']}).", "",
                  "| GPUs | nodes | DDP step ms | DDP all-reduce ms | DDP eff. | FSDP2 step ms | FSDP2 eff. | "
                  "HSDP eff. | samples/s per node |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['gpus']} | {r['nodes']} | {r['ddp']['step_ms']} | {r['ddp']['allreduce_ms']} | "
                  f"{r['ddp']['efficiency']:.1%} | {r['fsdp2']['step_ms']} | {r['fsdp2']['efficiency']:.1%} | "
                  f"{r['hsdp']['efficiency']:.1%} | {r['node_samples_per_s']} |" for r in d["rows"]]
        lines += ["", f"DDP: communication over 10% of the step from {d['ddp_dominates']['over_10_percent_at']} "
                  f"GPUs, over compute from {d['ddp_dominates']['over_compute_at']}; FSDP2: from "
                  f"{d['fsdp2_dominates']['over_10_percent_at']} and {d['fsdp2_dominates']['over_compute_at']} "
                  f"(None: not up to {out['assumptions']['gpus'][-1]}). DDP reaches 90% on "
                  f"{out['assumptions']['gpus'][-1]} GPUs from {d['tokens_per_gpu_for_90pct_ddp_at_max']} tokens per "
                  "GPU per step.", "",
                  recommended_line(d["recommended"]), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- --bytes-check: the model's bytes against the wire
# The bytes a training step really puts on the wire: two gloo ranks under torchrun inside a network namespace of their
# own (so its loopback carries their traffic and nothing else), the namespace's loopback byte counter read around runs
# of two lengths; the difference per step is what the step's collectives moved (rendezvous, start-up and the last
# step's save cancel out). Needs root (`ip netns`), as the cluster tests do; the namespace is removed on every exit.
TRAFFIC_ARMS = [("ddp", "fp32", 1), ("ddp", "bf16", 1), ("ddp", "fp32", 2), ("fsdp", "fp32", 1), ("fsdp", "bf16", 1)]


def _lo_bytes(ns: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/net/dev"], capture_output=True, text=True,
                         check=True).stdout
    row = next(line for line in out.splitlines() if line.strip().startswith("lo:"))
    return int(row.split(":", 1)[1].split()[8])  # transmitted bytes (on loopback every byte is sent once)


def _run(ns: str, work: Path, cfg, steps: int) -> tuple[int, int, int]:
    """Bytes on the namespace's loopback while `cfg` trains `steps` steps on two ranks, and the model's size (the
    elements of the weights it saved), all and outside the blocks FSDP shards one by one."""
    from roboloop.training.distributed import torchrun_command

    run = cfg.model_copy(update={"steps": steps, "output_dir": str(work / f"out-{steps}-{os.urandom(3).hex()}")})
    path = work / f"{Path(run.output_dir).name}.json"
    path.write_text(run.model_dump_json())
    before = _lo_bytes(ns)
    cmd = torchrun_command(str(path), nproc_per_node=2, rdzv_endpoint="127.0.0.1:29500")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"training in {ns} failed: {done.stderr[-2000:]}")
    sent = _lo_bytes(ns) - before
    from safetensors import safe_open

    with safe_open(str(Path(run.output_dir) / "model.safetensors"), "pt") as f:
        sizes = {k: _numel(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118  (a safetensors file)
    root = sum(n for k, n in sizes.items() if not k.startswith(("blocks.", "head_blocks.")))
    return sent, sum(sizes.values()), root


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def bytes_check(model_bytes: Callable[..., float], short: int = 4, long: int = 12) -> dict:
    """Per arm (strategy, grad_reduce, accumulate): the measured bytes per optimizer step on two ranks, the model's
    count (`model_bytes(params, strategy, grad_reduce, ranks, root_params, "gloo")`, both ranks' sends), and their
    ratio."""
    if os.geteuid() != 0:
        return {"skipped": "needs root for a network namespace"}
    from roboloop.datasets.convert import ConvertConfig, convert
    from roboloop.datasets.generate import GenSpec, generate_v21
    from roboloop.training.config import TrainConfig

    work = Path(tempfile.mkdtemp(prefix="roboloop-traffic-"))
    src = generate_v21(work / "v21", GenSpec(num_episodes=4, min_length=12, max_length=20,
                                            cameras={"observation.images.top": (32, 32)}, seed=6))
    v3 = convert(src, work / "v3", ConvertConfig(progress=False))
    ns = f"rltb{os.getpid() % 100000}traffic"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        out = {"ranks": 2, "steps": [short, long], "arms": {}}
        for strategy, reduce, accumulate in TRAFFIC_ARMS:
            cfg = TrainConfig(dataset=str(v3), output_dir=str(work), max_tokens=256, num_workers=1, device="cpu",
                              checkpoint_every_steps=0, strategy=strategy, grad_reduce=reduce, accumulate=accumulate,
                              model_overrides={"image_size": [32, 32], "horizon": 8})
            (sent_long, params, root), (sent_short, _, _) = _run(ns, work, cfg, long), _run(ns, work, cfg, short)
            per_step = (sent_long - sent_short) / (long - short)
            model = model_bytes(params, strategy, reduce, 2, root, "gloo")
            out["arms"][f"{strategy}_{reduce}_acc{accumulate}"] = {
                "measured_bytes_per_step": round(per_step), "model_bytes_per_step": round(model),
                "ratio": round(per_step / model, 3), "params": params, "root_params": root}
        out["within_10_percent"] = all(abs(a["ratio"] - 1) <= 0.1 for a in out["arms"].values())
        return out
    finally:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            subprocess.run(["kill", "-9", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["base", "n15"])
    ap.add_argument("--max-tokens", type=int, default=8192, help="tokens per GPU per step (a packed batch)")
    ap.add_argument("--mfu", type=float, default=0.35, help="assumed model FLOPs utilisation on the GPU")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="GPU dense BF16 peak (H100 SXM: 989)")
    ap.add_argument("--gpu-step-ms", nargs="*", default=[], metavar="PRESET=MS",
                    help="a step time measured on the GPU (bench/precision.py), instead of FLOPs / (peak x MFU)")
    ap.add_argument("--ib-gbps", type=float, default=400.0, help="NIC line rate per GPU, Gb/s")
    ap.add_argument("--nvlink-gbytes", type=float, default=450.0, help="NVLink one-way bandwidth per GPU, GB/s")
    ap.add_argument("--link-efficiency", type=float, default=0.9)
    ap.add_argument("--grad-bytes-per-param", type=int, default=4, choices=[2, 4],
                    help="the tables' gradient bytes: 4, fp32 (train.grad_reduce fp32, the default); 2, bf16 "
                    "(train.grad_reduce bf16); `recommended` tries both")
    ap.add_argument("--measure", nargs="*", default=[], help="presets to time forward+backward of on this CPU")
    ap.add_argument("--measure-tokens", type=int, default=640)
    ap.add_argument("--gpus", nargs="+", type=int, default=GPUS)
    ap.add_argument("--markdown", action="store_true", help="also print the tables as Markdown")
    ap.add_argument("--bytes-check", action="store_true", help="measure the bytes two gloo ranks' steps move "
                    "(a network namespace's loopback, root only) against sent_bytes")
    args = ap.parse_args()
    net = network(args.ib_gbps, args.nvlink_gbytes, args.link_efficiency)
    measured = dict(kv.split("=") for kv in args.gpu_step_ms)
    out: dict = {"baseline": "one GPU's compute time per step (no communication): efficiency 1.0 = perfect weak "
                 "scaling", "assumptions": {**{k: v for k, v in vars(args).items() if k not in ("markdown",)}},
                 "published": PUBLISHED, "presets": {}, "measured_here": [measure_cpu(p, args.measure_tokens)
                                                                          for p in args.measure]}
    for preset in args.presets:
        facts = model_facts(preset, args.max_tokens)
        facts["grad_bytes"] = args.grad_bytes_per_param * facts["params"]
        if preset in measured:
            step_s, source = float(measured[preset]) / 1e3, "measured on a GPU (--gpu-step-ms)"
        else:
            step_s = facts["flops_per_gpu_step"] / (args.peak_tflops * 1e12 * args.mfu)
            source = f"FLOPs / ({args.peak_tflops:g} TFLOP/s x MFU {args.mfu:g})"
        rows = [project(facts, step_s, p, net) for p in args.gpus]
        out["presets"][preset] = {**facts, "compute_ms": round(step_s * 1e3, 1), "compute_source": source,
                                  "rows": rows, "ddp_dominates": dominates(rows, "ddp"),
                                  "fsdp2_dominates": dominates(rows, "fsdp2"),
                                  "hsdp_efficiency_at_max": rows[-1]["hsdp"]["efficiency"],
                                  "ddp_efficiency_at_max": rows[-1]["ddp"]["efficiency"],
                                  "tokens_per_gpu_for_90pct_ddp_at_max": tokens_for(0.9, facts, step_s, args.gpus[-1],
                                                                                    net, args.max_tokens),
                                  "recommended": recommended(facts, step_s, args.gpus[-1], net)}
    if args.bytes_check:
        out["bytes_check"] = bytes_check(sent_bytes)
    if args.markdown:
        print(markdown(out))
    emit(out, MEASURES)


if __name__ == "__main__":
    main()
