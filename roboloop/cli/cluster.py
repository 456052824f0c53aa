"""`roboloop cluster`: the multi-node path. `join` is what pods 1..N-1 of a training Job run (infra/k8s-entrypoint.sh);
`render k8s` prints the Job and Service the gpu work pool submits (infra/k8s.py, which imports Prefect's Kubernetes
worker: it lives beside the job template, outside the library)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # roboloop/cli/cluster.py -> the repository


def add_parsers(sub, options) -> None:  # options: no pydantic-generated flags here
    cl = sub.add_parser("cluster", help="multi-node training: join node 0's run (pods 1..N-1), render the "
                        "Kubernetes manifests")
    what = cl.add_subparsers(dest="cluster_command", required=True)
    j = what.add_parser("join", help="as node K of a training job: wait for node 0's config in ROBOLOOP_RUN_STORE, "
                        "download its dataset, run this node's ranks (settings: ROBOLOOP_RUN_ID, ROBOLOOP_NNODES, "
                        "ROBOLOOP_NPROC_PER_NODE, ROBOLOOP_RDZV_ENDPOINT)")
    j.add_argument("--node-rank", type=int, help="this node's index (default: ROBOLOOP_NODE_RANK)")
    j.add_argument("--output-root", default=None, help="where this node's run folder goes (default: "
                   "<ROBOLOOP_ARTIFACTS>/models)")
    j.set_defaults(fn=cmd_join)
    r = what.add_parser("render", help="print a platform's manifests (k8s: the gpu pool's Job and headless Service, "
                        "validated against the Kubernetes API schema); the rest of the line goes to infra/k8s.py")
    r.add_argument("platform", choices=["k8s"])
    r.add_argument("rest", nargs=argparse.REMAINDER)
    r.set_defaults(fn=cmd_render)


def cmd_join(args: argparse.Namespace) -> int:
    from roboloop.cli.stages import ChildLines
    from roboloop.settings import settings
    from roboloop.training.config import LaunchConfig
    from roboloop.training.launch import join

    st = settings()
    launch = LaunchConfig.from_settings(node_rank=args.node_rank)
    if launch.node_rank == 0:
        raise ValueError("node 0 trains with `roboloop train` (or the flow); `cluster join` is for nodes 1..N-1")
    out_root = Path(args.output_root or Path(st.artifacts) / "models")
    out = join(launch, out_root, st.cache_dir, st.join_timeout_s, on_line=ChildLines(args.verbose))
    print(json.dumps({"node_rank": launch.node_rank, "nnodes": launch.nnodes, "run_id": launch.run_id,
                      "output_dir": str(out), "model": "written by node_rank 0"}))
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    script = ROOT / "infra" / "k8s.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script}: rendering needs roboloop's repository (infra/ is not installed)")
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    return subprocess.run([sys.executable, str(script), *rest], env=os.environ.copy()).returncode
