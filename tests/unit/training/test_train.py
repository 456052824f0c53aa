"""The trainer on CPU: it learns, it survives kill -9 with identical losses, it refuses NaN."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.training import checkpoint
from roboloop.training.config import TrainConfig
from roboloop.training.model import VLAPolicy
from roboloop.training.train import NonFiniteLossError, train
from tests.unit.training.conftest import kill9_at_step

OVERRIDES = {"image_size": [32, 32], "horizon": 8}


def _cfg(ds, out, **kw) -> TrainConfig:
    base = dict(dataset=str(ds), output_dir=str(out), max_tokens=1024, lr=2e-3, warmup_steps=10,
                checkpoint_every_steps=0, model_overrides=OVERRIDES)
    return TrainConfig(**{**base, **kw})


def _losses(out) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_tiny_overfits_small_dataset(tiny_v3, tmp_path):
    train(_cfg(tiny_v3, tmp_path, steps=300))
    losses = _losses(tmp_path)
    assert np.mean(losses[-10:]) * 10 <= np.mean(losses[:10]), (losses[:10], losses[-10:])
    for name in ("model.safetensors", "config.json", "stats.json", "loss.png"):
        assert (tmp_path / name).exists()


def test_kill9_then_resume_matches_uninterrupted(tiny_v3, tmp_path):
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    steps = 30
    train(_cfg(tiny_v3, ref, steps=steps, checkpoint_every_steps=10))
    cfg = _cfg(tiny_v3, killed, steps=steps, checkpoint_every_steps=10)
    kill9_at_step(cfg, 15)
    assert not (killed / "model.safetensors").exists()
    assert checkpoint.latest(killed / "checkpoints").name == "step-00000010"
    result = train(cfg)
    assert result.resumed_from == 10
    assert _losses(killed) == _losses(ref)  # bit-identical: same batches, same RNG, same kernels


def test_checkpoints_keep_last_k(tiny_v3, tmp_path):
    train(_cfg(tiny_v3, tmp_path, steps=25, checkpoint_every_steps=5, keep_last=2))
    assert [p.name for p in checkpoint.complete(tmp_path / "checkpoints")] == ["step-00000015", "step-00000020"]


def test_nan_loss_stops_without_final_model(tiny_v3, tmp_path, monkeypatch):
    real = VLAPolicy._errors  # (flow errors, auxiliary error): what the loss is made of
    calls = {"n": 0}

    def poisoned(self, b, generator=None, noise=None, u=None):
        calls["n"] += 1
        err, aux = real(self, b, generator, noise, u)
        return (err * float("nan") if calls["n"] == 3 else err), aux

    monkeypatch.setattr(VLAPolicy, "_errors", poisoned)
    with pytest.raises(NonFiniteLossError, match="at step 2"):
        train(_cfg(tiny_v3, tmp_path, steps=10, checkpoint_every_steps=1))
    assert not (tmp_path / "model.safetensors").exists()
    # the update of the poisoned step ran (the check waits for the device once, after it) but reached no checkpoint
    kept = checkpoint.complete(tmp_path / "checkpoints")
    assert [p.name for p in kept] == ["step-00000001", "step-00000002"]
    for found in kept:
        assert all(torch.isfinite(v).all() for v in checkpoint.load(found)["model"].values())


def test_explicit_fp8_on_cpu_says_what_is_missing(tiny_v3, tmp_path):
    from roboloop.availability import MissingCapability

    with pytest.raises(MissingCapability, match="compute capability"):
        train(_cfg(tiny_v3, tmp_path, steps=1, precision="fp8"))


def test_prefetch_changes_nothing_but_timing(tiny_v3, tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    train(_cfg(tiny_v3, a, steps=12, prefetch=True))
    train(_cfg(tiny_v3, b, steps=12, prefetch=False))
    train(_cfg(tiny_v3, c, steps=12, prefetch=True, lookahead="on"))  # CUDA's default, forced on this CPU
    assert _losses(a) == _losses(b) == _losses(c)
    firsts = [json.loads((d / "metrics.jsonl").read_text().splitlines()[0])["pipeline"] for d in (a, b, c)]
    assert firsts == [{"prefetch": True, "lookahead": False}, {"prefetch": False, "lookahead": False},
                      {"prefetch": True, "lookahead": True}]  # what ran is recorded: auto is off on CPU
    row = json.loads((a / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("loss", "lr", "samples_per_s", "tokens_per_s", "nonpad_fraction", "data_wait_fraction", "mfu"):
        assert key in row
    assert 0.0 < row["data_wait_fraction"] <= 1.0
    assert row["mfu"] is None  # CPU: no known peak unless ROBOLOOP_PEAK_TFLOPS is set


def test_mfu_reported_when_peak_known(tiny_v3, tmp_path, monkeypatch):
    monkeypatch.setenv("ROBOLOOP_PEAK_TFLOPS", "1.0")
    train(_cfg(tiny_v3, tmp_path, steps=3))
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(0.0 < r["mfu"] < 1.0 for r in rows)


def test_output_folder_has_an_owner(tiny_v3, tmp_path):
    from roboloop.errors import OutputOwnershipError

    done = train(_cfg(tiny_v3, tmp_path, steps=12, checkpoint_every_steps=5))
    assert json.loads((tmp_path / "run_config.json").read_text())["lr"] == 2e-3
    model = (tmp_path / "model.safetensors").read_bytes()
    metrics = (tmp_path / "metrics.jsonl").read_text()
    again = train(_cfg(tiny_v3, tmp_path, steps=12, checkpoint_every_steps=5))  # the same run: already done
    assert again.final_loss == done.final_loss
    with pytest.raises(OutputOwnershipError, match="finished model of 12 steps"):
        train(_cfg(tiny_v3, tmp_path, steps=8, checkpoint_every_steps=5))  # fewer steps: would replace it
    with pytest.raises(OutputOwnershipError, match="finished model of 12 steps"):
        train(_cfg(tiny_v3, tmp_path, steps=14, checkpoint_every_steps=5))
    with pytest.raises(OutputOwnershipError, match="different lr"):
        train(_cfg(tiny_v3, tmp_path, steps=12, checkpoint_every_steps=5, lr=1e-4))
    assert (tmp_path / "model.safetensors").read_bytes() == model
    assert (tmp_path / "metrics.jsonl").read_text() == metrics


def test_output_folder_refuses_another_dataset_and_foreign_folders(tiny_v3, tmp_path):
    from roboloop.errors import OutputOwnershipError

    other = convert(generate_v21(tmp_path / "v21b", GenSpec(num_episodes=2, min_length=16, max_length=20,
                                                            cameras={"observation.images.top": (32, 32)}, seed=9)),
                    tmp_path / "v3b", ConvertConfig(progress=False))
    out = tmp_path / "run"
    train(_cfg(tiny_v3, out, steps=6))
    with pytest.raises(OutputOwnershipError, match="different dataset"):
        train(_cfg(other, out, steps=6))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    with pytest.raises(OutputOwnershipError, match="left untouched"):
        train(_cfg(tiny_v3, mine, steps=6))
    assert (mine / "notes.txt").read_text() == "my notes" and len(list(mine.iterdir())) == 1
    replaced = train(_cfg(other, out, steps=6), overwrite=True)  # the old run is moved aside, not deleted
    assert replaced.steps == 6 and len(list(tmp_path.glob("run.replaced-*"))) == 1


def test_resume_needs_steps_beyond_the_latest_checkpoint(tiny_v3, tmp_path):
    from roboloop.errors import OutputOwnershipError
    from roboloop.training import outdir

    cfg = _cfg(tiny_v3, tmp_path, steps=20, checkpoint_every_steps=5)
    outdir.claim(tmp_path, cfg, outdir.dataset_fingerprint(tiny_v3))
    ck = tmp_path / "checkpoints" / "step-00000010"
    ck.mkdir(parents=True)
    (ck / "meta.json").write_text("{}")
    with pytest.raises(OutputOwnershipError, match="latest checkpoint is already at step 10"):
        outdir.plan(cfg.model_copy(update={"steps": 10}), outdir.dataset_fingerprint(tiny_v3))
    assert outdir.plan(cfg, outdir.dataset_fingerprint(tiny_v3)).action == "resume"


def test_a_run_refused_before_its_first_step_leaves_its_folder_to_the_fixed_run(tiny_v3, tmp_path):
    """A config only the model's builder rejects (here LeRobot's ACT, with an option it does not have) is refused
    after the run claimed its folder; the corrected run, another config, must be able to take that folder."""
    from roboloop.policies.lerobot import LeRobotPolicyError

    out = tmp_path / "run"
    bad = _cfg(tiny_v3, out, steps=2, family="lerobot", policy_type="act", policy_config={"no_such_option": 1},
               max_tokens=2048, model_overrides={})  # the VLA's settings: ACT reads neither (refused otherwise)
    with pytest.raises(LeRobotPolicyError, match="no_such_option"):
        train(bad)
    assert {f.name for f in out.iterdir()} <= {"run_config.json", ".roboloop-output.json"}
    fixed = train(bad.model_copy(update={"policy_config": {"dim_model": 32, "n_heads": 2, "dim_feedforward": 64}}))
    assert fixed.steps == 2 and (out / "model.safetensors").is_file()


def test_auxiliary_target_trains_from_recorded_environment_state_and_is_named_when_missing(tiny_v3, tmp_path):
    """A dataset recorded with observation.environment_state (as `collect` does for the -Vision- task) trains with it
    as the image tokens' auxiliary target: the model gets the head, metrics log its loss, and the policy acts
    without it. A dataset without that feature is refused by name before anything is written."""
    import torch

    from roboloop.datasets.writer import EpisodeWriterV21
    from roboloop.policies.obs import Obs
    from roboloop.policies.vla import ModelPolicy

    rng = np.random.default_rng(1)
    w = EpisodeWriterV21(tmp_path / "rec", 30, ["q0", "q1"], ["dx", "dy"], {"observation.images.top": (32, 32)},
                         env_state_names=["ball_x", "ball_y", "tip_x"])
    for n in (14, 17, 20):
        w.add_episode(rng.normal(size=(n, 2)), rng.normal(size=(n, 2)),
                      {"observation.images.top": rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8)}, "reach",
                      env_state=rng.normal(size=(n, 3)))
    v3 = convert(w.close(), tmp_path / "v3", ConvertConfig(progress=False))
    over = {**OVERRIDES, "image_encoder": "keypoints", "keypoints": 4, "keypoints_to_state": 1, "aux_to_state": 1}
    out = tmp_path / "out"
    train(_cfg(v3, out, steps=4, aux_target="observation.environment_state", model_overrides=over))
    saved = json.loads((out / "config.json").read_text())["model"]
    assert saved["aux_dim"] == 3 and saved["keypoints_to_state"] is True and saved["aux_to_state"] is True
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["aux_loss"] > 0 for r in rows)
    policy = ModelPolicy(out)
    obs = Obs(torch.zeros(2, 2), {"observation.images.top": torch.zeros(2, 32, 32, 3, dtype=torch.uint8)},
              ["reach", "reach"])
    assert policy.act(obs).shape[0] == 2
    with pytest.raises(ValueError, match="observation.environment_state.*not a feature"):
        train(_cfg(tiny_v3, tmp_path / "refused", steps=1, aux_target="observation.environment_state",
                   model_overrides=over))
    assert not (tmp_path / "refused" / "model.safetensors").exists()


def test_lr_schedules_warm_up_then_decay_or_hold():
    from roboloop.training.train import lr_at

    cos = TrainConfig(dataset="d", output_dir="o", steps=100, warmup_steps=10)
    const = TrainConfig(dataset="d", output_dir="o", steps=100, warmup_steps=10, lr_schedule="constant")
    for cfg in (cos, const):
        assert [lr_at(s, cfg) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]  # the same linear warm-up
    assert lr_at(10, cos) == 1.0 and abs(lr_at(55, cos) - 0.55) < 1e-9 and abs(lr_at(100, cos) - 0.1) < 1e-9
    assert {lr_at(s, const) for s in range(10, 101)} == {1.0}  # LeRobot's ACT preset: no scheduler
