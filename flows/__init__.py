"""Prefect flows: ingest, convert, train, evaluate, register and the closed loop that chains them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tasks.control_plane import guard_leases

guard_leases()  # every flow run's process: a lease that cannot be renewed never cancels the run


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


def _get(obj: object, dotted: str) -> object:
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def short(value: object) -> str:
    s = str(value).removeprefix("registry:")
    if "#" in s:  # registry:URI#NAME@REF: the name and version say it
        return s.split("#", 1)[1]
    if "/" in s and not s.startswith("s3://"):
        s = s.rstrip("/").rsplit("/", 1)[-1]  # a folder: its name
    return s


def run_name(template: str, **fields: str):
    """A `flow_run_name` callable: `template` filled from the run's parameters (dotted paths into the
    parameter models), e.g. run_name("evaluate {policy} on {task}", policy="params.policy",
    task="params.eval.task") -> "evaluate reach-vla@3 on Roboloop-Reach-Color-v0". Folders are shown by
    name, registry references without the `registry:` prefix."""

    def name() -> str:
        from prefect.runtime import flow_run

        params = flow_run.parameters or {}
        values = {k: next((v for p in path.split("|") if (v := _get(params, p)) is not None), None)
                  for k, path in fields.items()}  # "a|b": the first of them given
        return template.format(**{k: short("?" if v is None or v == "" else v) for k, v in values.items()})

    return name


def finish(result, message: str):
    """The flow's result as a Completed state carrying `message`, which the runs list and the run's header show
    (callers of the flow still get `result`)."""
    from prefect.states import Completed

    return Completed(message=message, data=result)


def rename(name: str) -> None:
    """Rename the running flow run (e.g. once an alias is resolved to the version it names)."""
    from prefect import get_run_logger
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=name)
    except Exception as e:  # the run goes on under its first name; the log says why
        get_run_logger().warning("could not rename this run to %r: %s", name, e)
