"""LeRobot's ACT through the closed loop (`roboloop loop`, no Prefect server): trained on roboloop's engine from
the single-instruction reach task's recorded demonstrations (`Roboloop-Reach-Red-v0`: ACT does not read the
instruction, so every episode names the red ball), evaluated there beside the random baseline, registered, and
promoted or not by the gate; then a DAgger round (ACT acts, the expert labels, training continues from its
weights); the registered folders are ones LeRobot's own `from_pretrained` reads.

No camera: the recordings carry the scene's state (`collect` with environment_state), which ACT reads as LeRobot's
ENV input, so the Evaluator and the DAgger round observe it for ACT (the camera path is in the unit tests and
`bench/policy.py`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.isaac, pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]
ACT = {"dim_model": 64, "dim_feedforward": 128, "n_encoder_layers": 1, "n_decoder_layers": 1, "n_heads": 4,
       "latent_dim": 8, "chunk_size": 8, "n_action_steps": 8}
RED = "Roboloop-Reach-Red-v0"


def test_act_through_the_closed_loop(tmp_path):
    from roboloop.loop import ci

    cfg = ci()
    cfg = cfg.model_copy(update={
        "collect_if_missing": cfg.collect_if_missing.model_copy(update={"task": RED, "camera": False,
                                                                        "environment_state": True}),
        "eval": cfg.eval.model_copy(update={"task": RED}),
        "train": cfg.train.model_copy(update={"policy_type": "act", "family": "lerobot", "policy_config": ACT,
                                              "steps": 15, "max_samples": 8, "lr": 1e-4,
                                              "max_tokens": 2048}),  # ci()'s is the VLA's: ACT would refuse it
        "rounds": 2, "dagger": cfg.dagger.model_copy(update={"episodes": 2, "num_envs": 2, "steps": 5}),
        "model_name": "reach-act"})
    (tmp_path / "loop.json").write_text(cfg.model_dump_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROBOLOOP_")}
    p = subprocess.run([sys.executable, "-m", "roboloop.cli", "loop", "--config", "loop.json"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-4000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["registry_version"] == 2
    from tests.gates import expected_decision

    promoted, reason = expected_decision(tmp_path / ".roboloop" / "registry", "reach-act", 2, cfg.margin)
    assert (summary["promoted"], summary["gate"]) == (promoted, reason)  # the rule applied to the recorded numbers
    assert [r["episodes"] for r in summary["rounds"]] == [12, 14]  # the expert's labels joined the data
    assert re.match(r"\d+ steps in \d+\.\d min; precision fp32", summary["training"]), summary["training"]

    from lerobot.policies.act.modeling_act import ACTPolicy

    from roboloop.registry import Registry

    reg = Registry(tmp_path / ".roboloop" / "registry")
    lineage = reg.lineage("reach-act", 1)
    assert lineage["family"] == "lerobot" and lineage["config"]["train"]["policy_type"] == "act"
    assert lineage["eval"]["task"] == RED
    assert lineage["eval"]["episodes"] == 6 and lineage["baseline_eval"]["policy"] == "random"
    dagger = reg.lineage("reach-act", 2)
    assert dagger["family"] == "lerobot" and dagger["config"]["train"]["init_from"]  # continued from round 0
    for v in (1, 2):
        folder = reg.download("reach-act", v, tmp_path / f"act-v{v}")
        config = ACTPolicy.from_pretrained(str(folder)).config
        assert config.chunk_size == 8 and not config.image_features
        assert config.env_state_feature is not None and config.env_state_feature.shape == (8,)  # balls' and tip's xy
    _same_episodes_whatever_the_number_of_envs(tmp_path, lineage)


def _same_episodes_whatever_the_number_of_envs(tmp_path, lineage: dict) -> None:
    """Determinism as a contract, for ACT: the registered model played alone (1 env) meets the same initial states
    as the loop's evaluation (6 envs) recorded in the registry, and every episode ends the same way: success and
    length exactly, and the return (it sums the distance to the ball over the episode, so a trajectory that drifted
    by batching would show there even where every episode fails) to float rounding."""
    from pathlib import Path

    record, model = lineage["eval"], Path(lineage["model"]["path"]).name  # v1's evaluation (the DAgger round's: v2)
    loop_runs = [json.loads(p.read_text()) for p in (tmp_path / "artifacts" / "evals").rglob("report.json")]
    ours = [r for r in loop_runs if r["policy"].endswith(model) and r["num_envs"] == 6]
    assert ours, [(r["policy"], r["num_envs"], r["episodes"]) for r in loop_runs]
    out = tmp_path / "alone"
    p = subprocess.run([sys.executable, "-m", "roboloop.cli", "evaluate", "--policy", "registry:reach-act@1",
                        "--task", RED, "--episodes", "4", "--num-envs", "1", "--videos", "0", "--output-dir", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if not k.startswith("ROBOLOOP_")})
    assert p.returncode == 0, p.stderr[-3000:]
    alone = json.loads((out / "report.json").read_text())
    assert alone["initial_states"] == record["initial_states"][:4 * 8], (alone["initial_states"], record)
    a = sorted(alone["per_episode"], key=lambda e: e["index"])
    b = sorted(ours[0]["per_episode"], key=lambda e: e["index"])[:4]
    assert [(e["index"], e["success"], e["length"]) for e in a] == [(e["index"], e["success"], e["length"]) for e in b]
    # The returns agree to float rounding, not bit for bit: a batch of 6 goes through other matmul kernels than a
    # batch of 1 (measured at 1 and 4 envs: 1e-4 in a return of -114, i.e. 1e-6 relative); the outcomes absorb it.
    gap = max(abs(x["ret"] - y["ret"]) / max(1.0, abs(y["ret"])) for x, y in zip(a, b, strict=True))
    assert gap <= 1e-5, (a, b)
