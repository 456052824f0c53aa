"""The loop's stage calls as Prefect task runs: `run_loop(cfg, PrefectSteps())` is the `closed-loop` flow.

Each method calls one task (`tasks/`), which calls the same library stage `LocalSteps` does and adds what
the UI shows: a task run per stage, retries of transient failures, relayed progress, artifacts.
"""

from __future__ import annotations

from tasks.dagger import aggregate_task, dagger_collect_task
from tasks.data import convert_task, ingest_task
from tasks.evaluate import evaluate_offline_task, evaluate_task
from tasks.register import register_task
from tasks.rl import rl_task
from tasks.serve import serve_check_task
from tasks.sweep import loop_candidates_task
from tasks.train import train_task


class PrefectSteps:
    def ingest(self, source, collect, track):
        return ingest_task(source, collect, track=track)

    def convert(self, raw, cfg, track):
        return convert_task(raw, cfg, track=track)

    def train(self, data, recipe, launch, track, execution):
        return train_task(data, recipe, launch, track=track, execution=execution)

    def evaluate(self, policy, recipe, against=None, margin=0.05):
        return evaluate_task(policy, recipe, against, margin)

    def evaluate_offline(self, model, data, recipe):
        return evaluate_offline_task(model, data, recipe)

    def register(self, model, lineage, name, margin):
        return register_task(model, lineage, name, margin=margin)

    def dagger_collect(self, model, recipe, round_, track):
        return dagger_collect_task(model, recipe, round_, track=track)

    def aggregate(self, sources, round_, track):
        return aggregate_task(sources, round_, track=track)

    def rl(self, parent, recipe, track):
        return rl_task(parent, recipe, track=track)

    def candidates(self, model, track):
        return loop_candidates_task(model, track)

    def serve_check(self, decision, recipe, reference, cfg):
        return serve_check_task(decision, recipe, reference, cfg)
