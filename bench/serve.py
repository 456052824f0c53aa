"""Policy-server latency and throughput on this machine, over loopback, against the same model in-process.

    python bench/serve.py [--requests 200] [--seconds 6] [--clients 1 8 32] [--families vla act] [--device cuda]
                          [--act-camera 96x128] [--precision fp32|bf16]

Models (weights do not change speed): `vla` is the demo's VLA shape (roboloop's tiny preset, horizon 8, the
reach task's state and action sizes, state only, 4 flow-matching steps); `act` is LeRobot's ACT at its
default size (ResNet-18 backbone, chunk 100) reading one 96x128 camera (`--act-camera HxW`: 480x640 is what
LeRobot's SO-101 recorder writes), trained for one step by
`roboloop train --policy-type act` on a generated dataset so the folder is a real one.

Baseline: `policy.act(obs)` in the bench's own process (no server). Served: `roboloop serve` in its own
process, one observation per request, the client's round trip (encode, send, batch, forward, reply, decode).
The two are timed in alternating blocks of 10 calls (fewer where a call takes longer than 30 ms: as many as fit in
0.3 s, at least one) while the server runs, so that a shared host's drift falls on both (measured alone, one after
the other, the same ACT ran 29 to 46 ms p50 in-process from run to run; at 480x640 in blocks of 10, 3 s each, a
40-request run once put the served p50 22.7 ms above the in-process one, and call by call 1 ms below it).
`served_overhead_ms` is what serving adds within each call, free of that drift: the round trip less the server's
own forward pass (`infer_ms`, timed around the model's `act` in the server), i.e. the wire, the event loop, the
batcher and the hop to the compute thread.
`robot_client` is the same overhead seen from a client in a process of its own that does nothing else (no model in
it, unlike this one: what `roboloop robot` is on an arm's computer), with glibc keeping freed blocks for the next
request (`PolicyClient`'s default, host_memory auto) and with glibc's defaults, and its page faults per request.
`--precision bf16`: the model acts under bf16 autocast in-process and in the server (`roboloop serve --precision
bf16`; refused on a CPU without AMX or AVX512-BF16); the ONNX rows stay fp32.
Both are also exported to ONNX (`roboloop export`) and timed on onnxruntime, in-process and served.
Throughput: K clients (threads, one websocket each) sending back to back for `--seconds`, against a server with
batching (`--max-batch 64`, no added wait: requests arriving during a forward pass share the next) and without
(`--max-batch 1`); `in_process_batching_gain_at_8` is the ceiling: one in-process pass over 8
observations against 8 passes over one. `tail_origin` (CPU) times the forward pass alone on one thread, wall clock and
the thread's CPU time per call, and a matmul loop of the same length in turn: whether its slow calls waited or ran
on a slower core, and what this machine's p99/p50 is for dense compute. The VLA is served once more by the Ray
Serve engine (`--engine ray`) with 1 and 2 replicas (what the engine's proxy hop costs). `server_threads` is what
the server chose for its torch threads and why (`--server-threads N` sets them). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CAM = "observation.images.front"

from record import emit  # noqa: E402  (bench/record.py: this script's folder is on sys.path)

# the code this bench measures: its records (bench/results/) are stale once a commit changes any of these
MEASURES = ["bench/serve.py", "roboloop/serving", "roboloop/policies"]


def vla_model(dst: Path, dims: list[int] | None = None) -> Path:
    import torch
    from safetensors.torch import save_file

    from roboloop.training.config import tiny
    from roboloop.training.model import VLAPolicy

    if dims:  # --vla-dims: where Isaac Lab is not installed
        s, a = dims
    else:
        from roboloop.sim.isaac_tasks import make_cfg

        c = make_cfg("Roboloop-Reach-Color-v0")
        space = c.action_space
        s, a = int(c.observation_space), int(space if isinstance(space, int) else space.shape[-1])
    torch.manual_seed(0)
    cfg = tiny(state_dim=s, action_dim=a, horizon=8)
    dst.mkdir(parents=True)
    save_file(VLAPolicy(cfg).state_dict(), str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps({"model": cfg.model_dump(mode="json"), "train": {}, "data": {
        "state_key": "observation.state", "action_key": "action", "camera_keys": [], "with_video": False}}))
    (dst / "stats.json").write_text(json.dumps({"observation.state": {"mean": [0.0] * s, "std": [1.0] * s},
                                                "action": {"mean": [0.0] * a, "std": [1.0] * a}}))
    return dst


ACT_CAMERA = (96, 128)  # `--act-camera`
SERVER_THREADS = 0  # `--server-threads`: roboloop serve's --threads (0: its default)
MAX_WAIT_MS: float | None = None  # `--max-wait-ms`: roboloop serve's --max-wait-ms (None: its default)
STARTED: dict[str, str] = {}  # what the last `roboloop serve` said of its torch threads


def act_model(work: Path) -> Path:
    def cli(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "roboloop.cli", *args], check=True, capture_output=True, text=True,
                       timeout=1200, cwd=work)

    cli("generate", str(work / "ds"), "--v3", "--camera", f"{CAM}={ACT_CAMERA[0]}x{ACT_CAMERA[1]}",
        "--num-episodes", "2")
    cli("train", "--dataset", str(work / "ds"), "--output-dir", str(work / "act"), "--policy-type", "act",
        "--steps", "1", "--max-samples", "2", "--checkpoint-every-steps", "0")
    return work / "act"


def observation(policy, n: int = 1):
    import torch

    from roboloop.policies.obs import Obs

    rng = np.random.default_rng(0)
    state = rng.normal(size=(n, policy.state_dim)).astype(np.float32)
    images = {k: rng.integers(0, 256, (n, *policy.image_size, 3), dtype=np.uint8) for k in policy.camera_keys}
    obs = Obs(torch.from_numpy(state), {k: torch.from_numpy(v) for k, v in images.items()}, ["reach"] * n)
    return obs, state, images


def pct(xs: list[float]) -> dict[str, float]:
    return {"p50": round(float(np.percentile(xs, 50)), 2), "p99": round(float(np.percentile(xs, 99)), 2)}


DEVICE = "cpu"  # --device: where the model runs, in-process and in the server (ONNX exports: onnxruntime's CPU)
PRECISION = "fp32"  # --precision: what the model (not its ONNX export) acts in, in-process and in the server


def start_server(model: Path, token_file: Path, max_batch: int, replicas: int = 0,
                 precision: str | None = None) -> tuple[subprocess.Popen, int]:
    """`roboloop serve` in its own process (replicas > 0: the Ray Serve engine with that many replicas)."""
    from roboloop.serving.check import LISTENING

    # OpenMP's workers wait passively (as in the loop's served check): with a busy core, spinning workers lose every
    # barrier and one pass of the demo's VLA on 2 threads took 360-750 ms instead of ~21
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "ROBOLOOP_SERVE_TOKEN_FILE": str(token_file),
           "RAY_USAGE_STATS_ENABLED": "0"}
    engine = ["--engine", "ray", "--replicas", str(replicas)] if replicas else []
    STARTED.clear()
    p = subprocess.Popen([sys.executable, "-m", "roboloop.cli", "serve", str(model), "--port", "0", "--max-batch",
                          str(max_batch), "--device", DEVICE, "--threads", str(SERVER_THREADS), "--precision",
                          precision or PRECISION,
                          *(["--max-wait-ms", str(MAX_WAIT_MS)] if MAX_WAIT_MS is not None else []), *engine],
                         stderr=subprocess.PIPE, text=True, env=env)
    deadline, said = time.time() + 180, collections.deque(maxlen=20)
    while time.time() < deadline:
        line = p.stderr.readline()  # type: ignore[union-attr]
        if line:
            said.append(line.rstrip())
        if m := re.search(r"; (\d+ torch threads \([^)]*\))", line):
            STARTED["threads"] = m.group(1)
        if m := LISTENING.search(line):
            threading.Thread(target=p.stderr.read, daemon=True).start()  # type: ignore[union-attr]
            return p, int(m.group(1))
        if not line and p.poll() is not None:
            break
    p.kill()
    raise SystemExit(f"roboloop serve did not start ({model}, exit {p.wait()}); its last lines:\n" + "\n".join(said))


def throughput(port: int, token: str, clients: int, seconds: float, state, images) -> float:
    from roboloop.serving.client import PolicyClient

    conns = [PolicyClient(f"serve://127.0.0.1:{port}", token=token) for _ in range(clients)]
    counts = [0] * clients
    t_end = time.perf_counter() + seconds

    def go(i: int) -> None:
        while time.perf_counter() < t_end:
            conns[i].act(state, images, ["reach"])
            counts[i] += 1

    threads = [threading.Thread(target=go, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    for c in conns:
        c.close()
    return sum(counts) / dt


ROBOT_CLIENT = """
import json, os, sys, time
import numpy as np
from roboloop.serving.client import PolicyClient
port, mode, n, shapes = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])  # token: from its file
def faults():
    return int(open(f"/proc/{os.getpid()}/stat").read().split()[9]) if os.path.exists("/proc/self/stat") else 0
rng = np.random.default_rng(0)
state = rng.normal(size=(1, shapes.pop("state"))).astype(np.float32)
images = {k: rng.integers(0, 256, (1, *v, 3), dtype=np.uint8) for k, v in shapes.items()}
with PolicyClient(f"serve://127.0.0.1:{port}", host_memory=mode) as c:
    for _ in range(5):
        c.act(state, images, ["reach"])
    f0, over = faults(), []
    for _ in range(n):
        r = c.act(state, images, ["reach"])
        over.append(r.roundtrip_ms - r.infer_ms)
    print(json.dumps({"host_memory": c.host_memory.split(" (")[0], "faults_per_request": (faults() - f0) // n,
                      "served_overhead_ms": {"p50": round(float(np.percentile(over, 50)), 2),
                                             "p99": round(float(np.percentile(over, 99)), 2)}}))
"""


def robot_client(port: int, token_file: Path, n: int, state, images) -> dict:
    """What serving adds for a client that does nothing else, as `roboloop robot` on an arm's computer: its own
    process (no model in it, unlike this one), one observation per request, glibc's allocator keeping freed
    blocks (the client's default, `PolicyClient(host_memory=)`) and with glibc's defaults."""
    shapes = {"state": int(state.shape[-1]), **{k: list(v.shape[1:3]) for k, v in images.items()}}
    out = {}
    for mode in ("auto", "system"):
        # the token by its file, as a robot's client reads it (a command line is visible to every user: ps)
        run = subprocess.run([sys.executable, "-c", ROBOT_CLIENT, str(port), mode, str(n), json.dumps(shapes)],
                             capture_output=True, text=True, check=True, timeout=1800,
                             env={**os.environ, "ROBOLOOP_SERVE_TOKEN_FILE": str(token_file)})
        r = json.loads(run.stdout.strip().splitlines()[-1])
        out[r.pop("host_memory")] = r
    return out


BLOCK = 10  # calls per block when in-process and served calls alternate (fewer for slow calls: `block_size`)
BLOCK_S = 0.3


def block_size(fn) -> int:
    """BLOCK calls of `fn`, or as many as take BLOCK_S, at least one."""
    t0 = time.perf_counter()
    fn()
    return max(1, min(BLOCK, int(BLOCK_S / max(time.perf_counter() - t0, 1e-6))))


def timed(fn, n: int, warm: bool = True) -> list[float]:
    for _ in range(5 if warm else 0):  # warm-up
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def tail_origin(fn, n: int) -> dict:
    """Where the forward pass's p99 comes from, on a CPU: `fn` timed `n` times on one torch thread (as the server
    runs a small model), wall clock and the thread's own CPU time per call. For the calls slower than 1.5x the
    median: `slow_wall_over_cpu` near 1 says the thread ran the whole time (not preempted, not waiting for a lock or
    the network), and `slow_cpu_over_median` near their slowdown says the same work took that much more CPU time:
    the core itself ran slower (on a VM, another tenant on the host). `dense_p99_over_p50` is the same for a matmul
    loop of about the same duration, timed in turn with `fn`: what this machine's tail is for dense compute."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    try:
        # warm up, then size the matmul loop to the pass (medians of warm calls, not the first, cold one)
        reps = max(1, round(float(np.median(timed(fn, 10))) / float(np.median(timed(lambda: a @ a, 10)))))

        def dense() -> None:
            for _ in range(reps):
                a @ a

        wall, cpu, dwall = [], [], []
        for _ in range(n):
            w0, c0 = time.perf_counter(), time.thread_time()
            fn()
            wall.append(time.perf_counter() - w0)
            cpu.append(time.thread_time() - c0)
            d0 = time.perf_counter()
            dense()
            dwall.append(time.perf_counter() - d0)
    finally:
        torch.set_num_threads(before)
    w, c = np.array(wall), np.array(cpu)
    slow = w > 1.5 * np.median(w)
    ratio = lambda x: round(float(np.percentile(x, 99) / np.percentile(x, 50)), 2)  # noqa: E731
    ws, cs = w[slow], c[slow]
    mean = lambda x: round(float(x.mean()), 2) if slow.any() else None  # noqa: E731
    return {"calls": n, "p99_over_p50": ratio(w), "slow_calls": int(slow.sum()),
            "slow_wall_over_cpu": mean(ws / np.maximum(cs, 1e-9)), "slow_cpu_over_median": mean(cs / np.median(c)),
            "slow_wall_over_median": mean(ws / np.median(w)), "dense_p99_over_p50": ratio(np.array(dwall))}


def served_latency(model: Path, token_file: Path, token: str, n: int, state, images, replicas: int = 0,
                  local=None, precision: str | None = None, robot: bool = False) -> dict:
    """Round trip and server-side inference ms of one observation per request (a batching server, one client).
    With `local` (the in-process call), the two are timed in alternating blocks of BLOCK calls, so that what
    drifts on this machine (a shared host's load) falls on both, and on a CPU `local` runs on as many torch threads
    as the server chose for its passes: a baseline on more threads than the server's ran the demo's VLA slower (two
    threads: 6.96 ms p50, one: ~4.6) and its OpenMP workers, spinning after each block, slowed the server's next
    passes (served p99/p50 2.26 in that run)."""
    from roboloop.serving.client import PolicyClient

    server, port = start_server(model, token_file, 64, replicas, precision)
    if local is not None and DEVICE == "cpu" and (m := re.match(r"(\d+) torch threads", STARTED.get("threads", ""))):
        import torch

        torch.set_num_threads(int(m.group(1)))  # the in-process baseline on as many threads as the server's passes
    try:
        with PolicyClient(f"serve://127.0.0.1:{port}", token=token) as c:
            replies: list = []
            here: list[float] = []
            served = lambda: replies.append(c.act(state, images, ["reach"]))  # noqa: E731
            timed(served, 0)
            block = block_size(local or served)
            while len(replies) < n + 5:
                if local is not None:
                    here += timed(local, block, warm=not here)
                timed(served, block, warm=False)
        robot_row = robot_client(port, token_file, min(n, 40), state, images) if robot else None
        replies = replies[5:]
        row = {"block": block, "served_ms": pct([r.roundtrip_ms for r in replies]),
               "served_infer_ms": pct([r.infer_ms for r in replies]),
               # what serving adds to the same call: its round trip less the server's own forward pass (the
               # wire, the event loop, the batcher and the hop to the compute thread), free of the pass's drift
               "served_overhead_ms": pct([r.roundtrip_ms - r.infer_ms for r in replies]),
               "server_threads": STARTED.get("threads"),
               "server_omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        row |= {"robot_client": robot_row} if robot else {}
        return row | ({"in_process_ms": pct(here)} if local is not None else {})
    finally:
        server.terminate()
        server.wait(30)


def chunks_per_s(model: Path, token_file: Path, token: str, max_batch: int, args, state, images,
                 replicas: int = 0) -> dict:
    server, port = start_server(model, token_file, max_batch, replicas)
    try:
        return {str(k): round(throughput(port, token, k, args.seconds, state, images), 1) for k in args.clients}
    finally:
        server.terminate()
        server.wait(30)


def bench(name: str, model: Path, args, work: Path) -> dict:
    from roboloop.policies import load_policy
    from roboloop.serving.token import read_token

    policy = load_policy(model, DEVICE, precision=PRECISION)
    obs, state, images = observation(policy)
    token_file = work / "token"
    token = read_token(token_file, create=True)
    import torch

    row: dict = {"model": name, "precision": PRECISION}
    row |= served_latency(model, token_file, token, args.requests, state, images, local=lambda: policy.act(obs),
                          robot=True)
    row["in_process_threads"] = torch.get_num_threads()
    if DEVICE == "cpu":
        row["tail_origin"] = tail_origin(lambda: policy.act(obs), max(50, args.requests))
    # what batching can give at most here: 8 observations in one in-process pass against 8 passes of one
    obs8 = observation(policy, 8)[0]
    one, eight = (float(np.median(timed(lambda o=o: policy.act(o), max(10, args.requests // 8)))) for o in (obs, obs8))
    row["in_process_batching_gain_at_8"] = round(8 * one / eight, 2)
    row["chunks_per_s_batched"] = chunks_per_s(model, token_file, token, 64, args, state, images)
    row["chunks_per_s_unbatched"] = chunks_per_s(model, token_file, token, 1, args, state, images)
    # the same model exported to ONNX: in-process on onnxruntime, and served from the export
    from roboloop.serving.export import export_onnx, open_export

    export_onnx(model, work / f"{name}-onnx", instruction="reach" if name == "vla" else "")
    op = open_export(work / f"{name}-onnx")
    onnx = served_latency(work / f"{name}-onnx", token_file, token, args.requests, state, images,
                          local=lambda: op.act(obs), precision="fp32")
    row["onnx_in_process_ms"], row["served_onnx_ms"] = onnx["in_process_ms"], onnx["served_ms"]
    for replicas in args.ray_replicas if name == "vla" else []:  # the same app on Ray Serve
        ray_row = served_latency(model, token_file, token, args.requests, state, images, replicas)
        ray_row["chunks_per_s_batched"] = chunks_per_s(model, token_file, token, 64, args, state, images, replicas)
        row[f"ray_serve_{replicas}_replicas"] = ray_row
    row["served_minus_in_process_p50_ms"] = round(row["served_ms"]["p50"] - row["in_process_ms"]["p50"], 2)
    row["served_overhead_p50_ms"] = row["served_overhead_ms"]["p50"]
    row["served_p99_over_p50"] = round(row["served_ms"]["p99"] / row["served_ms"]["p50"], 2)
    if "8" in row["chunks_per_s_batched"]:
        row["batching_gain_at_8"] = round(row["chunks_per_s_batched"]["8"] / row["chunks_per_s_unbatched"]["8"], 2)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--families", nargs="+", default=["vla", "act"], choices=["vla", "act"])
    ap.add_argument("--vla-dims", type=int, nargs=2, metavar=("STATE", "ACTION"), help="the VLA's state and "
                    "action sizes (default: read from Roboloop-Reach-Color-v0's config, which needs Isaac Lab)")
    ap.add_argument("--server-threads", type=int, default=0, help="roboloop serve --threads (0: its default)")
    ap.add_argument("--act-camera", default="96x128", help="HxW of ACT's one camera")
    ap.add_argument("--device", default="cpu", help="torch device of the model in-process and in the server")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="what the model acts in, "
                    "in-process and served (bf16: autocast, where the device multiplies bf16 natively)")
    ap.add_argument("--max-wait-ms", type=float, default=None, help="roboloop serve --max-wait-ms (default: its "
                    "own)")
    ap.add_argument("--ray-replicas", type=int, nargs="*", default=[1, 2], help="also serve the VLA with "
                    "`--engine ray` at these replica counts (none: skip Ray Serve)")
    args = ap.parse_args()
    global DEVICE, ACT_CAMERA, SERVER_THREADS, PRECISION, MAX_WAIT_MS
    SERVER_THREADS, MAX_WAIT_MS = args.server_threads, args.max_wait_ms
    DEVICE, PRECISION = args.device, args.precision
    h, w = args.act_camera.lower().split("x")
    ACT_CAMERA = (int(h), int(w))
    sys.path.insert(0, str(ROOT))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for fam in args.families:
            model = vla_model(work / "vla", args.vla_dims) if fam == "vla" else act_model(work)
            rows.append(bench(fam, model, args, work))
            r = rows[-1]
            print(f"{fam}: in-process p50 {r['in_process_ms']['p50']} ms p99 {r['in_process_ms']['p99']} | served "
                  f"p50 {r['served_ms']['p50']} ms p99 {r['served_ms']['p99']} (infer p50 "
                  f"{r['served_infer_ms']['p50']}, overhead p50 {r['served_overhead_ms']['p50']}) | chunks/s "
                  f"batched {r['chunks_per_s_batched']} unbatched "
                  f"{r['chunks_per_s_unbatched']} (in-process ceiling at 8: {r['in_process_batching_gain_at_8']}x) | "
                  f"robot-side client overhead p50 {r['robot_client']['keep']['served_overhead_ms']['p50']} "
                  f"(glibc's defaults: {r['robot_client']['system']['served_overhead_ms']['p50']}) | tail: "
                  f"{r.get('tail_origin')}",
                  file=sys.stderr)
    emit({"bench": "serve", "baseline": "policy.act in the bench's own process", "cpu_threads":
          os.cpu_count(), "device": device_name(args.device), "act_camera": args.act_camera,
          "precision": args.precision,
          "rows": rows}, MEASURES)


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"


if __name__ == "__main__":
    main()
