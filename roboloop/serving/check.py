"""The loop's last step: the version it registered, served to a robot's side of the loop and driven through it.

`roboloop serve registry:NAME@vN` starts in a child process on 127.0.0.1 (any free port, the token in the
usual file), and the evaluator plays the first episodes of the loop's own evaluation through it
(`--policy serve://127.0.0.1:PORT`, the simulator as the robot). The result (`ServedCheck`) says whether every
episode ended as it did in-process (the same start states, noise seed, precision and torch thread count, so
the same chunks), which version answered, and how long a chunk took to come back; the demo's summary prints it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from roboloop.evaluation.config import EvalRecipe
from roboloop.receipts import Decision, EvalSummary, Receipt

LISTENING = re.compile(r"listening on ws://127\.0\.0\.1:(\d+)$")  # the whole line: another one glued on is no port


class ServeCheckRecipe(BaseModel):
    """After the loop registers its model: serve that version (`roboloop serve`, a child process on 127.0.0.1) and
    play the first `episodes` of the loop's evaluation through the server, as a robot would be driven."""

    episodes: int = Field(16, ge=1, description="episodes played through the server (the first of the loop's "
                          "evaluation: each should end as it did in-process)")
    start_timeout_s: float = Field(180.0, gt=0, description="how long the server may take to load and check the "
                                   "model before the check gives up")


class ServedCheck(Receipt):
    """What the served check saw: the version that answered, the outcomes against in-process, chunk latency."""

    ref: str = Field(description="what was served (registry:NAME@N)")
    versions: dict[str, int] = Field(description="the versions that produced chunks, and how many each")
    episodes: int = Field(ge=0, description="episodes played through the server")
    same_outcomes: int = Field(ge=0, description="of those, how many ended as in-process (success or not)")
    successes: int = Field(ge=0, description="successes through the server")
    in_process_successes: int = Field(ge=0, description="successes in-process on the same episodes")
    chunks: int = Field(ge=0, description="chunks the server sent")
    roundtrip_ms_p50: float | None = None
    roundtrip_ms_p99: float | None = None
    infer_ms_p50: float | None = Field(None, description="the server's own forward pass, p50")
    eval_run: str = Field(description="the served evaluation's folder (report.json: per episode, `served`)")
    threads: int = Field(0, ge=0, description="torch threads the server's forward passes ran on (the evaluator's: "
                         "the same sums, so the same chunks; OpenMP's workers waiting passively)")

    def identity(self) -> str:
        return self.eval_run

    def line(self) -> str:
        version = ", ".join(f"{v} ({n} chunks)" for v, n in self.versions.items()) or "no version"
        same = "every episode" if self.same_outcomes == self.episodes else \
            f"{self.same_outcomes} of {self.episodes} episodes (the rest differ: see {self.eval_run})"
        lat = f"chunk round trip p50 {self.roundtrip_ms_p50:.1f} ms, p99 {self.roundtrip_ms_p99 or 0:.1f} ms (the " \
              f"model's pass p50 {self.infer_ms_p50 or 0:.1f} ms)" if self.roundtrip_ms_p50 is not None else \
            "no chunk timed"
        threads = f" on {self.threads} torch thread{'s' * (self.threads != 1)}" if self.threads else ""
        return (f"{self.ref} by roboloop serve on 127.0.0.1{threads}, answered by {version}: "
                f"{self.successes}/{self.episodes} succeeded, {same} ended as in-process; {lat}")


def serve_ref(decision: Decision, alias: str | None = None) -> str:
    """The registered version (or `alias`, e.g. champion) as `roboloop serve` takes it: the registry named unless it
    is the default one."""
    from roboloop.registry import default_uri

    here = decision.registry in (default_uri(), str(Path(default_uri()).absolute()))
    return f"registry:{'' if here else decision.registry + '#'}{decision.name}@{alias or decision.version}"


def start_server(ref: str, seed: int, device: str, threads: int, precision: str, timeout_s: float,
                 on_line: Callable[[str], None]) -> tuple[subprocess.Popen, int]:
    """`roboloop serve REF --port 0` in its own process group; returns it and the port it listens on. Its log lines
    go to `on_line`; a server that exits or does not listen within `timeout_s` raises with its last lines."""
    cmd = [sys.executable, "-m", "roboloop.cli", "serve", ref, "--port", "0", "--seed", str(seed), "--device", device,
           "--threads", str(threads), "--precision", precision, "--max-batch", "64"]
    on_line("$ " + " ".join(cmd))
    # OpenMP's workers wait passively: the check keeps the evaluator's thread count (the same sums, so the same
    # chunks), and with a busy core libgomp's spinning workers lost every barrier (the demo's VLA: 360-750 ms a
    # pass on 2 threads, ~21 ms passively)
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1,
                            start_new_session=True, env=env)
    found: list[int] = []
    seen: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        with proc.stderr:  # closed when the server exits
            for line in proc.stderr:
                line = line.rstrip()
                seen.append(line)
                on_line("[serve] " + line)
                if not found and (m := LISTENING.search(line)):
                    found.append(int(m.group(1)))
                    ready.set()
        ready.set()  # the server's stderr closed: it exited

    threading.Thread(target=pump, daemon=True, name="roboloop-serve-log").start()
    ready.wait(timeout_s)
    if not found:
        from roboloop.procs import kill_group

        kill_group(proc, 5.0)
        why = "exited" if proc.poll() is not None else f"did not listen within {timeout_s:.0f} s"
        raise RuntimeError(f"roboloop serve {ref} {why}: " + " | ".join(seen[-5:]))
    return proc, found[0]


def served_check(decision: Decision, recipe: EvalRecipe, reference: EvalSummary, cfg: ServeCheckRecipe,
                 on_line: Callable[[str], None] = print) -> ServedCheck:
    """Serve `decision`'s version and play the first `cfg.episodes` of `reference` (the loop's in-process
    evaluation of that model with `recipe`) through the server; never cached (a server is asked live)."""
    import json

    import torch

    from roboloop import stages
    from roboloop.procs import kill_group

    if not reference.outcomes:
        raise ValueError(f"{reference.run_dir}: the evaluation numbers no episodes; nothing to compare with")
    n = min(cfg.episodes, len(reference.outcomes))
    ref = serve_ref(decision)
    # the evaluator's child computes with this process's thread count (same environment); the server does too, so
    # both sum in the same order and give the same chunks
    threads = torch.get_num_threads()
    server, port = start_server(ref, reference.seed, recipe.device, threads, recipe.precision,
                                cfg.start_timeout_s, on_line)
    try:
        served = recipe.model_copy(update={"episodes": n, "num_envs": min(n, recipe.num_envs), "videos": 0,
                                           "early_stop": False, "precision": "fp32",
                                           "execute_steps": reference.execution.execute_steps})
        t0 = time.perf_counter()
        s = stages.evaluate(f"serve://127.0.0.1:{port}", served, cache=None, on_line=on_line)
        on_line(f"served check: {n} episodes through the server in {time.perf_counter() - t0:.0f} s")
    finally:
        kill_group(server, 10.0)
    report = json.loads((Path(s.run_dir) / "report.json").read_text())
    info = report.get("served") or {}
    here, there = reference.outcomes[:n], s.outcomes or ""
    return ServedCheck(ref=ref, versions=dict(info.get("versions") or {}), episodes=s.episodes,
                       same_outcomes=sum(a == b for a, b in zip(here, there, strict=False)), successes=s.successes,
                       in_process_successes=here.count("1"), chunks=int(info.get("chunks") or 0),
                       roundtrip_ms_p50=info.get("roundtrip_ms_p50"), roundtrip_ms_p99=info.get("roundtrip_ms_p99"),
                       infer_ms_p50=info.get("infer_ms_p50"), eval_run=s.run_dir, threads=threads)
