"""The RL driver's watch over its workers' machines, on a real two-node Ray cluster on this machine (Ray's own
multi-node test harness: a head and a second raylet, each its own processes): a wait on a live worker ends once the
other machine has been declared dead for the grace period, and not before."""

from __future__ import annotations

import time

import pytest

from roboloop.rl.liveness import Liveness, MachineLost
from roboloop.rl.run import get

pytestmark = pytest.mark.slow


@pytest.fixture
def two_nodes(monkeypatch):
    import shutil
    import tempfile

    import ray
    from ray.cluster_utils import Cluster

    # Ray's harness writes its head's address where a plain ray.init() looks for a cluster to join: in a folder of
    # its own, so that no other test's Ray joins this one (and the sockets' paths stay short)
    temp = tempfile.mkdtemp(prefix="rl-live-", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", temp)
    # the GCS declares a silent raylet dead after 3 missed checks 0.5 s apart (Ray's defaults: 65 s)
    health = {"health_check_period_ms": 500, "health_check_timeout_ms": 500, "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": health})
    other = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster, other
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.timeout(120)  # without the watch, the wait never ends
def test_a_wait_on_a_live_worker_ends_once_the_other_machine_is_dead_past_its_grace(two_nodes):
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cluster, other = two_nodes
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=60)
    watch = Liveness.of(pg, period_s=0.2, grace_s=2.0)
    assert watch.node_ids == {cluster.head_node.node_id, other.node_id}

    @ray.remote(num_cpus=1)
    def forever() -> None:  # a worker on the head that never answers (as one waiting on the lost machine)
        time.sleep(3600)

    head = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=next(
        i for i, n in ray.util.placement_group_table(pg)["bundles_to_node_id"].items()
        if n == cluster.head_node.node_id))
    ref = forever.options(scheduling_strategy=head).remote()
    ready, _ = ray.wait([ref], timeout=3)
    assert not ready
    watch()  # both machines alive: the wait goes on
    cluster.remove_node(other, allow_graceful=False)  # its raylet killed: silent from now on
    t0 = time.monotonic()
    with pytest.raises(MachineLost) as lost:
        get(ref, watch)
    waited = time.monotonic() - t0
    assert lost.value.node_id == other.node_id and lost.value.ip == other.node_ip_address, lost.value
    assert f"at {other.node_ip_address} dead" in str(lost.value), lost.value
    assert 2.0 <= waited < 30, waited  # not before the grace period; soon after the GCS's verdict
