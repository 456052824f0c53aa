"""A promotion report: what the new champion is, what it replaced and why the gate let it through. Run by the
`promotion-report` deployment when a `roboloop.model.promoted` event arrives (deployments/prefect.yaml)."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from flows import run_name
from tasks.register import promotion_report_task


class ReportParams(BaseModel):
    ref: str = Field("registry:reach-vla@champion", description="registry:NAME@VERSION (or registry:URI#NAME@V)")


@flow(name="promotion-report", log_prints=True, flow_run_name=run_name("report {ref}", ref="params.ref"))
def promotion_report(params: ReportParams = ReportParams()) -> str:
    return promotion_report_task(params.ref)
