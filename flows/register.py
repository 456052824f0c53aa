"""Register a trained model with its lineage; promote it only if it is not worse than the champion."""

from __future__ import annotations

from prefect import flow
from pydantic import BaseModel, Field

from flows import finish, run_name
from roboloop.lineage import Lineage
from roboloop.loop.summary import decision_message
from roboloop.receipts import Decision
from tasks.register import register_task


class RegisterParams(BaseModel):
    name: str = Field("reach-vla", description="model name in the registry")
    lineage: Lineage = Field(description="the stages' receipts: dataset, model (its folder), evaluation")
    margin: float = Field(0.05, ge=0, le=1, description="non-inferiority margin on the success rate")
    promote: bool = Field(True, description="run the promotion gate")


@flow(name="register", log_prints=True, flow_run_name=run_name("register {name}", name="params.name"))
def register_flow(params: RegisterParams) -> Decision:
    if params.lineage.model is None:
        raise ValueError("the lineage names no model (lineage.model)")
    d = register_task(params.lineage.model, params.lineage, params.name, margin=params.margin,
                      promote=params.promote)
    return finish(d, decision_message(d))  # type: ignore[return-value]
