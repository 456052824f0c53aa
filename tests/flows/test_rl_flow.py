"""The rl-finetune flow end to end on the real reach task: a registry version is fine-tuned on Ray, evaluated by
the same Evaluator and registered as a new version whose lineage names its parent."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.isaac, pytest.mark.slow]


def test_rl_flow_registers_a_child_of_the_champion(tmp_path, monkeypatch):
    from flows.rl_finetune import RLParams, rl_finetune
    from roboloop.evaluation.config import EvalRecipe
    from roboloop.registry import Registry
    from roboloop.rl.config import RLRecipe
    from tests.isaac.test_rl import _untrained_model

    monkeypatch.setenv("ROBOLOOP_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setenv("ROBOLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ROBOLOOP_REGISTRY", str(tmp_path / "registry"))
    reg = Registry(tmp_path / "registry")
    dataset = {"path": str(tmp_path / "gone"), "md5": "d41d8cd98f00b204e9800998ecf8427e.dir", "format": "v3.0",
               "num_episodes": 8, "num_frames": 800, "fps": 30}
    lineage = {"git_commit": "abc", "dataset_md5": dataset["md5"], "dataset": dataset, "config": {"a": 1},
               "metrics": {"final_loss": 1.0}, "eval": {"task": "Roboloop-Reach-Color-v0", "seed": 0,
                                                       "execute_steps": 4, "episodes": 4, "successes": 0,
                                                       "outcomes": "0000"}}
    reg.promote("reach", reg.register("reach", _untrained_model(tmp_path / "bc"), lineage), force=True)

    rl = RLRecipe(mode="sync", env_steps=2 * 256, env_workers=2, envs_per_worker=4, segment_decisions=4,
                  segments_per_update=2, epochs=1, minibatch=32, critic_warmup_updates=0)
    out = rl_finetune(RLParams(model=f"registry:{reg.uri}#reach@champion", rl=rl, model_name="reach",
                               eval=EvalRecipe(episodes=4, num_envs=4, videos=0)))
    assert out.decision is not None and out.decision.version == 2
    child = reg.lineage("reach", 2)
    assert child["parents"] == ["reach@v1"]
    assert child["dataset_md5"] == dataset["md5"] and child["config"]["rl"]["mode"] == "sync"
    assert child["eval"]["episodes"] == 4 and child["model"]["execution"]["execute_steps"] == 4
