"""`make cluster-demo`: the scheduled retraining on a cluster, on this machine's test hosts (infra/testbed.py).

    control   PostgreSQL, and the Prefect server on it (infra/server.sh, basic auth)
    store     S3 (moto's server): the datasets, the run store, the model registry, the DVC remote
    node-0    a gpu-pool worker (--limit 1: one training at a time, as on a GPU node)
    node-1    a gpu-pool worker, and the cpu-pool worker that runs the loop's flow

Each node has a checkout of its own (this working tree, copied: what its image would hold) whose DVC remote is the
S3 store; the nodes share no folder. Then, as a team would:
  1. record demonstrations (the scripted expert) and put them in s3://roboloop/datasets/reach;
  2. deploy closed-loop-cluster, train-node and watch-datasets (deployments/prefect.yaml) with the team's sizes;
  3. run closed-loop-cluster as its schedule would: the flow on the cpu pool ingests from S3, hands training to the
     gpu pool (one train-node run per node, meeting through the run store), evaluates the model it takes back in the
     simulator, registers it in the S3 registry (the first version becomes champion) and pushes to the DVC remote;
  4. new episodes land in s3://roboloop/incoming/; watch-datasets (run as its 10-minute schedule would) announces
     them, and its trigger starts closed-loop-cluster on them: it retrains and gates against the champion.
Every host, process and file it made is gone at the end, on failure too (--keep leaves the work folder).

    make cluster-demo                         # root (network namespaces); about 10 minutes on 2 cores
    python infra/cluster_demo.py --quick      # tests/cluster/test_cluster_loop.py's sizes: every step, no skill
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostservices as hs  # noqa: E402
import testbed  # noqa: E402

ROOT, PY = hs.ROOT, hs.PY
HOSTS = ["control", "store", "node-0", "node-1"]
AUTH = "roboloop:cluster-demo"
S3 = {"ROBOLOOP_S3_ENDPOINT_URL": f"http://store:{hs.S3_PORT}", "AWS_ACCESS_KEY_ID": "roboloop",
      "AWS_SECRET_ACCESS_KEY": "roboloop-demo", "AWS_DEFAULT_REGION": "us-east-1"}
SOURCE, INCOMING = "s3://roboloop/datasets/reach", "s3://roboloop/incoming"
LOOP, WATCH = "closed-loop/closed-loop-cluster", "watch-datasets/watch-datasets"


@dataclass(frozen=True)
class Sizes:
    episodes: int = 512  # = roboloop.loop.demo(): its policy reaches the named ball 100% of the time (docs/guides/demo.md)
    new_episodes: int = 512
    steps: int = 1200
    eval_episodes: int = 48
    baseline_episodes: int = 16
    num_envs: int = 64


QUICK = Sizes(episodes=16, new_episodes=16, steps=30, eval_episodes=8, baseline_episodes=4, num_envs=16)


def loop_params(sizes: Sizes) -> dict:
    """closed-loop-cluster's parameters at these sizes, as a team deploys it: its preset (cluster, from the
    deployment), the settings people change, and the rest as overrides."""
    return {"steps": sizes.steps, "episodes": sizes.eval_episodes,
            "overrides": {"train": {"checkpoint_every_steps": max(10, sizes.steps // 6)},
                          "eval": {"num_envs": min(16, sizes.eval_episodes)},
                          "baseline_episodes": sizes.baseline_episodes}}


def node_env(work: Path, host: str, api: str) -> dict[str, str]:
    """What a node's image and the cluster's secrets give its processes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROBOLOOP_", "PREFECT_", "AWS_"))}
    return {**env, **S3, "PREFECT_API_URL": api, "PREFECT_API_AUTH_STRING": AUTH,
            "PREFECT_HOME": str(work / host / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1", "ROBOLOOP_HOME": str(work / host / "roboloop"),
            "ROBOLOOP_RUN_STORE": "s3://roboloop/runs", "ROBOLOOP_REGISTRY": "s3://roboloop/registry",
            "ROBOLOOP_JOIN_TIMEOUT_S": "600", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0",
            "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def checkout(work: Path, host: str) -> Path:
    """This working tree's files (tracked and new, not ignored) as the node's own checkout, its DVC remote in S3."""
    dst = work / host / "roboloop"
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        if (ROOT / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst / rel)
    dvc = str(Path(PY).parent / "dvc")
    for cmd in (["git", "init", "-q"], [dvc, "remote", "add", "--local", "-d", "s3", "s3://roboloop/dvc"],
                [dvc, "remote", "modify", "--local", "s3", "endpointurl", S3["ROBOLOOP_S3_ENDPOINT_URL"]]):
        subprocess.run(cmd, cwd=dst, check=True, capture_output=True)
    return dst


def sh(tb, host: str, cmd: list[str], env: dict, cwd: Path, timeout: float = 600, what: str = "") -> str:
    r = tb.run(host, cmd, env=env, cwd=cwd, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{what or cmd[:3]} on {host} failed ({r.returncode}): {(r.stderr or r.stdout)[-3000:]}")
    return r.stdout


def record(tb, work: Path, env: dict, sizes: Sizes, episodes: int, seed: int, url: str) -> None:
    """The scripted expert's demonstrations, recorded on node-0 and put in S3 (as a team's recordings land)."""
    dst = work / "recordings" / f"seed{seed}"
    sh(tb, "node-0", [PY, "-m", "roboloop.cli", "collect", str(dst), "--episodes", str(episodes), "--num-envs",
                      str(min(sizes.num_envs, episodes)), "--seed", str(seed), "--noise", "0.5",
                      "--instructions-per-layout", "3", "--no-camera"], env, work, what="recording")
    code = ("import sys; from roboloop.s3 import client, upload_dir\n"
            "try: client().create_bucket(Bucket='roboloop')\nexcept Exception as e:\n"
            "    if 'BucketAlready' not in type(e).__name__ + str(e): raise\n"
            "upload_dir(sys.argv[1], sys.argv[2])")
    sh(tb, "node-0", [PY, "-c", code, str(dst), url], env, work, what="upload")


def deploy(tb, env: dict, cwd: Path, sizes: Sizes) -> None:
    prefect = [str(Path(PY).parent / "prefect"), "--no-prompt"]
    for pool in ("cpu", "gpu"):
        sh(tb, "node-0", [*prefect, "work-pool", "create", pool, "--type", "process"], env, cwd, what="pool")
    file = ["--prefect-file", "deployments/prefect.yaml"]
    for name, params in (("closed-loop-cluster", loop_params(sizes)), ("train-node", None),
                         ("watch-datasets", {"params": {"location": INCOMING}})):
        extra = ["--params", json.dumps(params)] if params else []
        sh(tb, "node-0", [*prefect, "deploy", *file, "--name", name, *extra], env, cwd, what=f"deploy {name}")


def workers(tb, work: Path, envs: dict[str, dict]) -> None:
    for host, pool in (("node-0", "gpu"), ("node-1", "gpu"), ("node-1", "cpu")):
        with open(work / f"worker-{pool}-{host}.log", "w") as log:  # the worker has its own copy of the file
            tb.popen(host, [str(Path(PY).parent / "prefect"), "worker", "start", "--pool", pool, "--name",
                            f"{pool}-{host}", *(["--limit", "1"] if pool == "gpu" else [])],
                     env=envs[host], cwd=envs[host]["ROBOLOOP_HOME"], stdout=log, stderr=subprocess.STDOUT)


def client(tb, env: dict, cwd: Path, *args: str, timeout: float = 3600, say=print) -> str:
    """infra/cluster_client.py on node-0, its lines passed on as they come."""
    cmd = [PY, str(ROOT / "infra" / "cluster_client.py"), *args]
    p = tb.popen("node-0", cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    assert p.stdout is not None
    with p.stdout:
        for line in p.stdout:
            out.append(line.rstrip())
            if args[0] == "follow":
                say(f"  {line.rstrip()}")
    if p.wait(timeout):
        raise RuntimeError(f"cluster_client {' '.join(args)} failed:\n" + "\n".join(out[-60:]))
    return out[-1] if out else ""


def during_training(fault, say, when: str = "train-node"):
    """A `say` that also starts `fault()` in a thread the first time a line shows a run or task whose label begins
    with `when` RUNNING (default: a train-node run; "train": the train task, before it submits the node runs, so
    the fault meets their workers starting them), and a function that waits for it and raises what it raised."""
    started: list[threading.Thread] = []
    failed: list[BaseException] = []

    def guarded() -> None:
        try:
            fault()
        except BaseException as e:  # noqa: BLE001 - given to the caller by finished()
            failed.append(e)

    def watch(line: str) -> None:
        say(line)
        if not started and re.search(rf"\s{re.escape(when)}[^:]*: RUNNING", line):
            started.append(threading.Thread(target=guarded, daemon=True))
            started[0].start()

    def finished() -> None:
        if not started:
            raise RuntimeError(f"the fault never started: no {when} was seen RUNNING")
        started[0].join(600)
        if failed:
            raise failed[0]

    return watch, finished


def run(tb, work: Path, sizes: Sizes, say=print, force_first: bool = False, fault=None,
        fault_when: str = "train-node") -> dict:
    """Steps 1-4 on a testbed that is up; returns the summary (registry decisions, hosts, DVC objects). `fault`, a
    function, is called (in a thread) once the second run's `fault_when` is RUNNING (`during_training`)."""
    say("control: PostgreSQL, the Prefect server on it; store: S3")
    db = hs.postgres(tb, "control", work / "pg")
    api = hs.prefect_server(tb, "control", db, work, AUTH)
    hs.moto(tb, "store", work)
    envs = {h: node_env(work, h, api) for h in ("node-0", "node-1")}
    homes = {h: checkout(work, h) for h in envs}
    env, home = envs["node-0"], homes["node-0"]
    say(f"1. recording {sizes.episodes} demonstrations into {SOURCE}")
    record(tb, work, env, sizes, sizes.episodes, 0, SOURCE)
    say("2. deploying closed-loop-cluster, train-node, watch-datasets; workers: gpu on node-0 and node-1, "
        "cpu on node-1")
    deploy(tb, env, home, sizes)
    workers(tb, work, envs)
    say(f"3. {LOOP}, as its schedule runs it")
    first = client(tb, env, home, "run", LOOP)
    client(tb, env, home, "follow", first, say=say)
    if force_first:  # a quick run's policy is not shown better than random: a team seeds its champion by hand
        say("   v1 made champion by hand (roboloop registry promote reach-vla 1 --force), so the retraining has one")
        sh(tb, "node-0", [PY, "-m", "roboloop.cli", "registry", "promote", "reach-vla", "1", "--force"], env, home,
           what="promote")
    arrived = f"{INCOMING}/reach-{time.strftime('%Y%m%d')}"
    say(f"4. {sizes.new_episodes} new episodes land in {arrived}; {WATCH} runs as its schedule would")
    record(tb, work, env, sizes, sizes.new_episodes, 1, arrived)
    since = time.time() - 5
    client(tb, env, home, "follow", client(tb, env, home, "run", WATCH), say=say)
    second = client(tb, env, home, "triggered", LOOP, arrived, "--after", str(since))
    watch, fault_done = during_training(fault, say, fault_when) if fault else (say, None)
    client(tb, env, home, "follow", second, say=watch)
    if fault_done:
        fault_done()
    summary = json.loads(client(tb, env, home, "summary", "reach-vla", "s3://roboloop/registry", "s3://roboloop/dvc"))
    return {**summary, "first_run": first, "second_run": second, "arrived": arrived}


def report(s: dict) -> str:
    lines = ["", "registry s3://roboloop/registry, model reach-vla:"]
    for d in s["decisions"]:
        ev = s["evals"].get(str(d["version"])) or s["evals"].get(d["version"]) or {}
        src = s["sources"].get(str(d["version"])) or s["sources"].get(d["version"])
        lines.append(f"  v{d['version']}: {ev.get('successes')}/{ev.get('episodes')} on {src}; "
                     f"{'promoted' if d['promoted'] else 'not promoted'} ({d['reason']})")
    lines.append(f"  champion: v{s['champion']}; DVC remote s3://roboloop/dvc holds {len(s['dvc_keys'])} objects")
    lines += [f"  {r['name']}: {r['state']} (worker {r['worker']})" for r in sorted(s["runs"], key=lambda r: r["name"])]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="test sizes: every step runs, the policy learns nothing")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, node disks) afterwards")
    args = ap.parse_args(argv)
    why = "needs root (network namespaces)" if os.geteuid() else None
    if why:
        print(f"cluster-demo {why}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="roboloop-"))
    work.chmod(0o755)
    tb = testbed.Testbed(HOSTS)
    try:
        tb.up()
        print(f"test hosts {', '.join(f'{h} {a}' for h, a in tb.addresses.items())}; logs in {work}")
        print(report(run(tb, work, QUICK if args.quick else Sizes(), force_first=args.quick)))
        return 0
    finally:
        tb.down()
        left = testbed.leftovers(tb.tid)
        if left:
            print(f"left behind: {left}", file=sys.stderr)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
