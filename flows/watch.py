"""Watch a location for new LeRobot datasets; each one that arrives (or changes) becomes a
`roboloop.dataset.arrived` event, which the `closed-loop-cpu` deployment's trigger turns into a run of
the closed loop on it (deployments/prefect.yaml). Scheduled every 10 minutes by the `watch-datasets`
deployment; the location is only read."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from flows import run_name
from tasks.data import watch_task


class WatchParams(BaseModel):
    location: str = Field("incoming", description="a folder or s3://bucket/prefix whose child folders are datasets")


@flow(name="watch-datasets", log_prints=True, flow_run_name=run_name("watch {location}", location="params.location"))
def watch_datasets(params: WatchParams = WatchParams()) -> list[str]:
    return watch_task(params.location)
