"""`make demo`: the whole closed loop on embedded defaults, then where everything is.

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
    args = parser.parse_args(argv)
    os.chdir(REPO)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "roboloop")
    from roboloop import dvc

    dvc.init_repo(REPO)
    t0 = time.time()
    if not (REPO / "data" / "meta" / "info.json").exists() and (REPO / "data.dvc").exists():
        pulled = subprocess.run([sys.executable, "-m", "dvc", "pull", "-q", "data.dvc"], capture_output=True)
        print("data/: pulled from the DVC remote" if pulled.returncode == 0 else
              "data/: not in the DVC remote here; the scripted expert will record it")
    from flows import embedded
    from flows.closed_loop import closed_loop

    with embedded():
        s = closed_loop(PRESETS[args.preset]())
    print("\n" + "=" * 72)
    print(f"closed loop finished in {time.time() - t0:.0f} s")
    print("\n".join(s.human()))
    print("=" * 72)
    print(s.json_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
