"""One node's part of a training job that the `closed-loop-cluster` flow hands to the gpu pool (`tasks/nodes.py`):
node 0 downloads the job's dataset from the run store, hosts the rendezvous and mirrors the run there; the others
read node 0's address there and join. Runs of this deployment are started by the train task, not by people."""

from __future__ import annotations

from prefect import flow

from flows import run_name
from roboloop.training.remote import NodeParams
from tasks.nodes import node_task


def _name() -> str:
    import socket

    return run_name("train-node {rank} of {run} on " + socket.gethostname(), rank="params.node_rank",
                    run="params.run_id")()


@flow(name="train-node", log_prints=True, flow_run_name=_name)  # the host that took it, in the runs list
def train_node(params: NodeParams) -> str:
    return node_task(params)
