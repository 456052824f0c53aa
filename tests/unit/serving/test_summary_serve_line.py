"""The loop's summary says how to serve the champion it produced (the next stage), with a reference that resolves."""

from __future__ import annotations

from roboloop.loop.summary import LoopSummary
from roboloop.receipts import Decision
from roboloop.serving.follow import resolve


def _summary(registry: str, promoted: bool) -> LoopSummary:
    d = Decision(registry=registry, name="reach-vla", version=1, promoted=promoted, reason="r",
                 champion=1 if promoted else None)
    return LoopSummary(dataset_v3="d", dataset_md5="m", model="x", model_md5="m", weights_sha256="0" * 64,
                       final_loss=0.1, success_rate=0.9, ci=(0.8, 0.95), eval_run="e", random_success_rate=0.0,
                       decision=d)


def test_a_promoted_champion_is_shown_with_the_command_that_serves_it(tmp_path, monkeypatch):
    from roboloop.registry import Registry
    from tests.models import untrained_model

    reg = Registry(tmp_path / "registry")
    reg.register("reach-vla", untrained_model(tmp_path / "m", 6, 3, 8), {
        "git_commit": "abc", "dataset_md5": "d41d8cd98f00b204e9800998ecf8427e.dir", "config": {"lr": 1},
        "metrics": {"final_loss": 0.1}, "eval": {"successes": 9, "episodes": 10},
        "baseline_eval": {"successes": 0, "episodes": 10, "policy": "random"}})
    assert reg.promote("reach-vla", 1).promoted
    line = [x for x in _summary(reg.uri, True).human() if "serve the champion" in x]
    assert len(line) == 1
    ref = line[0].split("roboloop serve ")[1].split()[0]
    folder, version, follow = resolve(ref, tmp_path / "cache")
    assert version == "reach-vla@v1" and follow is not None and (folder / "model.safetensors").is_file()
    assert not [x for x in _summary(reg.uri, False).human() if "serve the champion" in x]
