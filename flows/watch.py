"""Watch a location for new LeRobot datasets; each one that arrives (or changes) becomes a
`roboloop.dataset.arrived` event, which the `closed-loop-cpu` deployment's trigger turns into a run of
the closed loop on it (deployments/prefect.yaml). Scheduled every 10 minutes by the `watch-datasets`
deployment; the location is only read."""

from __future__ import annotations

from prefect import flow, task
from prefect.events import emit_event
from pydantic import BaseModel, Field

from flows import run_name
from roboloop.datasets.watch import changes
from roboloop.settings import settings
from roboloop.stages import slug


class WatchParams(BaseModel):
    location: str = Field("incoming", description="a folder or s3://bucket/prefix whose child folders are datasets")


@task(name="watch")
def watch_task(location: str) -> list[str]:
    from pathlib import Path

    state = Path(settings().cache_dir) / "watch" / f"{slug(location, 64)}.json"
    new = changes(location, state)
    for path in new:
        emit_event("roboloop.dataset.arrived", resource={"prefect.resource.id": f"roboloop.location.{slug(path, 96)}",
                                                         "prefect.resource.name": path, "roboloop.path": path},
                   payload={"location": location, "path": path})
    print(f"{len(new)} new or changed dataset(s) in {location}" + "".join(f"\n  {p}" for p in new))
    return new


@flow(name="watch-datasets", log_prints=True, flow_run_name=run_name("watch {location}", location="params.location"))
def watch_datasets(params: WatchParams = WatchParams()) -> list[str]:
    return watch_task(params.location)
