"""How `make test` spreads the suite over the machine's cores: pytest-xdist workers, one thread each on a 2-core
machine (`--dist loadgroup`, `Makefile`).

The suite alone on the 2-core CI machine left 30% of it idle (session 24's `vmstat`): the simulator steps on one
core, and most Isaac Lab tests are subprocesses that do little else. Two workers at one thread each keep both
cores busy without oversubscribing them (a niced 2-thread training beside another training ran 14x slower: its
threads wait for each other at every barrier while one of them waits for a core).

A work unit is what one worker runs from start to end, in order:
- a test file (its module-scoped fixtures, such as the SO-101 tests' shared recording, are made once);
- `tests/deploy` (its Prefect server and worker stack is package-scoped);
- each bench's smoke run (`tests/e2e/test_benches.py`), on its own;
- `ray-serve`: the tests that start a Ray Serve application (one at a time on the machine).
The units that took longest go first, so that what is left at the end is short and both workers end together.
"""

from __future__ import annotations

import os

# seconds each unit took in session 24's `make test` on the 2-core CI-like machine (bench runs: alone); the rest
# are shorter and keep their collection order after these
UNIT_SECONDS = {
    "tests/isaac/test_so101_task.py": 360,  # session 46: its loop once (setup 239 s), the physics step replayed
    "tests/flows/test_closed_loop.py": 380,  # session 46: the RL round in the DAgger loop
    "tests/e2e/test_fresh_clone.py": 500,  # its training: 310 s of 1,200 steps on one thread
    "tests/deploy": 220,  # session 46: its teardown waits 15 s for cancelled runs, not 60
    "tests/isaac/test_act_loop.py": 150,
    "tests/isaac/test_robust_gate.py": 175,  # session 51: two demo-recipe models trained (120 steps each; 172 s alone)
    "tests/isaac/test_sim_to_sim.py": 75,
    "tests/isaac/test_so101_dressing.py": 70,  # session 49: two simulators, the expert under two factors
    "tests/isaac/test_camera_factors.py": 35,  # session 50: two tasks' probes (one simulator each)
    "tests/unit/sim/test_add_a_task.py": 45,  # session 54: the guide's task recorded, a tiny model trained (42 s alone)
    "bench:so101": 55,
    "tests/isaac/test_reach_variants.py": 174,
    "tests/isaac/test_serve_reach.py": 60,  # session 46: the SO-101's served check is in its loop
    "bench:dagger": 155,
    "tests/unit/evaluation/test_lerobot_envs.py": 80,  # session 51: Diffusion and a lerobot-train ACT (73 s alone)
    "ray-serve": 330,  # session 41: with bench:rl (66 s) and tests/isaac/test_rl.py (84 s)
    "bench:rl": 130,
    "bench:policy": 120,
    "bench:lerobot_train": 115,
    "tests/unit/policies/test_lerobot_train_parity.py": 165,  # session 47: with the examples (ACT trained, two gated)
    "bench:sweep": 95,
    "tests/isaac/test_reach_task.py": 90,
    "bench:eval": 90,
    "bench:loader": 85,
    "bench:robustness": 60,  # session 42: 4 demos, 3 steps, 2 episodes nominal + 1 factor + 50 ms, policy and expert
    "tests/isaac/test_eval_cache.py": 84,
    "tests/isaac/test_warm_workers.py": 55,  # session 53: three cold starts, two parent processes
    "tests/flows/test_loop_cli.py": 84,
    "tests/isaac/test_rl.py": 84,
    "tests/isaac/test_policy_family.py": 78,
    "tests/cluster/test_cluster_loop.py": 315,  # session 46: the scheduled retraining on 4 hosts, two loop runs
    "tests/unit/training/test_compile.py": 95,  # session 41: eager + compiled 50 steps, a compiled kill -9 + resume
    "tests/unit/training/test_fp8_compiled.py": 100,  # session 43: fp32, eager and compiled tensorwise, eager rowwise
    "tests/unit/policies/test_lerobot_compile.py": 60,  # session 43: ACT and Diffusion, eager + compiled 24 steps
    "tests/isaac/test_robust_eval.py": 115,  # session 43: the expert under 2 factors and 200 ms at 2 env counts; a
    # short-trained VLA at 1 and 8 envs
    "tests/cluster/test_lost_node.py": 85,  # session 40: four 2-host runs, one restarted, one cut
    "tests/cluster/test_leases.py": 41,  # session 55: a Prefect server stopped and restarted under a lease
    "tests/cluster/test_fsdp_hosts.py": 50,  # session 54: FSDP and HSDP across hosts, a resharded resume (46 s alone)
    "tests/cluster/test_ray_hosts.py": 62,  # session 40: a Ray cluster on two hosts serving 8 robots, one host cut
    "tests/cluster/test_ray_rl.py": 60,  # session 40: RL's workers on two hosts; one host cut
    "tests/cluster/test_k8s_job.py": 60,  # session 40: three 2-host runs and a reference, on test hosts
    "tests/faults/test_errors.py": 72,
    "tests/unit/training/test_distributed.py": 130,
    "tests/isaac/test_cpu_graph.py": 100,  # session 46: three tasks, eager and replayed
    "tests/faults/test_serve_loss.py": 45,  # session 39's estimates: servers killed and restarted
    "tests/faults/test_serve_abuse.py": 40,
    "tests/unit/policies/test_plan.py": 60,  # session 56: π0.5 built on the meta device four times, two plans
    "tests/unit/policies/test_finetune.py": 70,  # sessions 56-57: SmolVLA LoRA (and killed, resumed), ACT frozen
    "tests/flows/test_node_runs.py": 35,  # session 57: node runs followed on the harness, one crash resubmitted
}
# one after another: two Ray clusters at once on 2 cores starved the serving test's robots (tests/cluster)
# (make test at d014ea6: bench:rl's Ray beside test_ray_hosts's cluster left a robot refused until the end), so every
# test or bench that starts Ray is in this unit
RAY_SERVE = {"tests/unit/serving/test_ray_engine.py", "bench:serve", "tests/cluster/test_ray_hosts.py",
             "tests/cluster/test_ray_rl.py", "bench:rl", "tests/isaac/test_rl.py"}


def distributed() -> bool:
    """True in a pytest-xdist worker."""
    return "PYTEST_XDIST_WORKER" in os.environ


def unit_of(item) -> str:
    from tests.e2e.background import is_bench_item

    path = item.nodeid.split("::")[0]
    if is_bench_item(item):
        path = f"bench:{item.callspec.params['name']}"
    elif path.startswith("tests/deploy/"):
        path = "tests/deploy"
    return "ray-serve" if path in RAY_SERVE else path


def arrange(items: list) -> None:
    """Mark each item with its unit (`xdist_group`) and put the longest units first, each unit's items together in
    their collection order."""
    import pytest

    units = {id(item): unit_of(item) for item in items}
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(units[id(item)], i)
        item.add_marker(pytest.mark.xdist_group(units[id(item)]))
    items.sort(key=lambda it: (-UNIT_SECONDS.get(units[id(it)], 0), first[units[id(it)]]))
