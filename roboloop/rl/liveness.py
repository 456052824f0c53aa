"""The RL driver's watch over the machines its workers run on.

Ray fails the calls to a lost machine's actors once its GCS declares the machine dead (missed heartbeats). A driver
that waits only on live workers which themselves wait on the lost one (an environment worker asking the rollout
worker for actions) depends on that failure reaching each of them. While it waits, the driver also asks the GCS,
every few seconds, whether the machines holding its workers are alive, and gives up on a machine that has been dead
for `grace_s`: Ray's own error, which names the worker, gets that long to arrive first.
"""

from __future__ import annotations

import time
from typing import Any


class MachineLost(Exception):
    """A machine holding one of the run's workers was declared dead by Ray's GCS and the wait went on."""

    def __init__(self, ip: str, node_id: str, dead_s: float):
        super().__init__(f"its GCS declared node {node_id[:12]} at {ip} dead {dead_s:.0f} s ago")
        self.ip, self.node_id = ip, node_id


class Liveness:
    """Called on each turn of a driver's wait loop; raises MachineLost (at most one GCS query per `period_s`)."""

    def __init__(self, node_ids: set[str], period_s: float = 2.0, grace_s: float = 15.0):
        self.node_ids, self.period_s, self.grace_s = set(node_ids), period_s, grace_s
        self._next = time.monotonic() + period_s
        self._dead_since: dict[str, float] = {}

    @classmethod
    def of(cls, pg: Any, **kw: Any) -> Liveness:
        """The machines that placement group `pg` (ready) put its bundles on."""
        from ray.util import placement_group_table

        return cls(set(placement_group_table(pg)["bundles_to_node_id"].values()), **kw)

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        import ray

        self._next = now + self.period_s
        dead = {n["NodeID"]: n for n in ray.nodes() if n["NodeID"] in self.node_ids and not n["Alive"]}
        self._dead_since = {k: self._dead_since.get(k, now) for k in dead}
        for node_id, since in self._dead_since.items():
            if now - since >= self.grace_s:
                raise MachineLost(dead[node_id].get("NodeManagerAddress", "?"), node_id, now - since)
