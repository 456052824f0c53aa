"""A control plane that falters does not lose the loop: a stage that waits on other runs rides out a Prefect API that
fails for up to `ROBOLOOP_CONTROL_PLANE_GRACE_S` (600 s), and a run's concurrency lease that cannot be renewed never
cancels the run.

Found on the test hosts (tests/cluster/test_cluster_loop.py, tests/cluster/test_leases.py): with PostgreSQL down the
server answers 500, which Prefect's client does not retry, so the loop's train task failed on its first poll and
cancelled node runs that were training fine; a stopped server outlasts the client's five retries (62 s). And
Prefect 3.8.8 renews a deployment-concurrency lease three times in 3 s and then cancels the flow run ("Concurrency
lease renewal failed ... Terminating execution"): a server down at that moment, or restarted with its leases in
memory (410 Gone), killed hours of training. Here the renewal is retried for the grace period, and a lease that is
gone is said in the run's log while the run goes on (the deployment's limit no longer counts it: the server keeps
leases across restarts with infra/server.sh's PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from uuid import UUID

from roboloop.settings import settings

RETRIED_STATUS = {408, 429, 500, 502, 503, 504}


def api_fault(e: BaseException) -> str | None:
    """What about `e` says the Prefect API failed rather than refused (its server or database down, a restart),
    or None: a 4xx answer and every other error are not ridden out."""
    import httpx

    if isinstance(e, httpx.TransportError):
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if isinstance(e, httpx.HTTPStatusError) and e.response.status_code in RETRIED_STATUS:
        return f"HTTP {e.response.status_code}"
    return None


def ride_out[T](call: Callable[[], T], what: str, log: logging.Logger | logging.LoggerAdapter,
             grace_s: float | None = None, pause_s: float = 3.0) -> T:
    """`call()` again while the API fails (`api_fault`), for up to `grace_s` (the setting) from the first failure;
    says when it began failing and when it answered again. Any other error, or the grace spent, is raised."""
    grace = settings().control_plane_grace_s if grace_s is None else grace_s
    since: float | None = None
    while True:
        try:
            out = call()
        except Exception as e:
            fault = api_fault(e)
            if fault is None:
                raise
            now = time.monotonic()
            if since is None:
                since = now
                log.warning(f"{what}: the Prefect API failed ({fault}); retrying for up to {grace:.0f} s "
                            "(ROBOLOOP_CONTROL_PLANE_GRACE_S) while the runs go on")
            elif now - since > grace:
                raise RuntimeError(f"{what}: the Prefect API failed for {now - since:.0f} s, past "
                                   f"ROBOLOOP_CONTROL_PLANE_GRACE_S={grace:g} ({fault})") from e
            time.sleep(pause_s)
            continue
        if since is not None:
            log.warning(f"{what}: the Prefect API answers again after {time.monotonic() - since:.0f} s")
        return out


def renew_lease(client, lease_id: UUID, lease_duration: float, stop_event: threading.Event) -> bool:
    """Prefect's `_renew_concurrency_lease_with_retries`, as roboloop's runs need it: an API that fails is retried
    for the grace period (backing off to 15 s); a lease the server no longer has (410), or the grace spent, is
    said and the renewal stops with the run going on. False ends the renewal thread without cancelling the run."""
    from prefect.logging.loggers import get_logger

    log = get_logger("roboloop.leases")
    grace, t0, delay = settings().control_plane_grace_s, time.monotonic(), 1.0
    while True:
        try:
            client.renew_concurrency_lease(lease_id=lease_id, lease_duration=lease_duration)
            if time.monotonic() - t0 > 1:
                log.warning(f"concurrency lease {lease_id} renewed after {time.monotonic() - t0:.0f} s of failures")
            return True
        except Exception as e:
            fault = api_fault(e)
            if fault is None or time.monotonic() - t0 > grace:
                spent = time.monotonic() - t0
                why = f"the API failed for {spent:.0f} s ({fault})" if fault else f"{type(e).__name__}: {e}"
                log.warning(f"concurrency lease {lease_id} cannot be renewed ({why}): this run goes on, and the "
                            "deployment's concurrency limit no longer counts it (infra/server.sh keeps leases "
                            "across server restarts)")
                return False
            if stop_event.wait(delay):
                return False
            delay = min(2 * delay, 15.0)


def guard_leases() -> None:
    """Replace Prefect 3.8.8's lease renewal (three tries, then the run is cancelled) with `renew_lease`, in this
    process (a flow run's: flows/__init__.py calls it). Fails loudly if Prefect no longer has the function."""
    from prefect.concurrency import _leases

    if not hasattr(_leases, "_renew_concurrency_lease_with_retries"):
        raise RuntimeError("prefect.concurrency._leases._renew_concurrency_lease_with_retries is gone: "
                           "tasks/control_plane.py needs updating for this Prefect version")
    _leases._renew_concurrency_lease_with_retries = renew_lease
