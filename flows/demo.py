"""`make demo`: the whole closed loop on embedded defaults, then where everything is.

`python -m flows.demo --source DIR_OR_S3` runs the same loop on your own LeRobot dataset (offline
evaluation on the episodes training holds out, unless `--evaluation simulator`).

Embedded defaults: an ephemeral Prefect server (no PREFECT_API_URL needed), the local DVC
remote (.roboloop/dvc-remote), the local registry (.roboloop/registry), the reach task in
Isaac Lab on CPU with the assets in assets/, and the `tiny` model. `data/` comes from the
DVC remote when it has it; otherwise the scripted expert records it (bit-identical on every
machine, so `data.dvc` does not change).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    from roboloop.loop import PRESETS
    from roboloop.settings import settings

    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default=settings().demo_preset,
                        help="demo (default) or ci (the same loop on a tiny budget; also $ROBOLOOP_DEMO_PRESET)")
    parser.add_argument("--source", help="your own LeRobot dataset (v2.0/v2.1/v3.0): a folder anywhere or "
                        "s3://bucket/prefix; it is only read, the loop versions its own copy")
    parser.add_argument("--evaluation", choices=["offline", "simulator"], default="offline",
                        help="with --source: offline (score the 10%% of episodes training holds out; real-robot "
                        "data) or simulator (the preset's Isaac Lab task)")
    parser.add_argument("--model-name", help="with --source: registry name (default: the dataset folder's name)")
    args = parser.parse_args(argv)
    cfg = PRESETS[args.preset]()
    if args.source:
        from roboloop.loop import for_source

        cfg = for_source(cfg, args.source, args.evaluation, args.model_name)  # before chdir: a relative path is yours
    os.chdir(REPO)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "roboloop")
    from roboloop import dvc

    dvc.init_repo(REPO)
    t0 = time.time()
    if not args.source and not (REPO / "data" / "meta" / "info.json").exists() and (REPO / "data.dvc").exists():
        pulled = subprocess.run([sys.executable, "-m", "dvc", "pull", "-q", "data.dvc"], capture_output=True)
        print("data/: pulled from the DVC remote" if pulled.returncode == 0 else
              "data/: not in the DVC remote here; the scripted expert will record it")
    from flows import embedded
    from flows.closed_loop import closed_loop

    with embedded():
        s = closed_loop(cfg=cfg)
    print("\n" + s.report(time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
