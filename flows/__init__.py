"""Prefect flows: ingest, convert, train, evaluate, register and the closed loop that chains them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def embedded() -> Iterator[None]:
    """Settings for flows run in this process (make demo, scripts), not by a worker.

    Flow-run heartbeats let a server detect crashed worker-launched runs; in-process they only
    cost time: Prefect 3.8.8 joins the heartbeat thread at every flow-run exit, and that thread
    sleeps in 1 s steps, so each (sub)flow run takes ~1 s longer (0.15 s without). Settings
    cannot switch heartbeats off from the environment (the field rejects empty values), hence this.
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
