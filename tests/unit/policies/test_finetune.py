"""`train.finetune`: what trains, what the run record counts, and a saved model that is plain.

- LoRA (PEFT's adapters on the layers LeRobot itself names for `lerobot-train --peft`) on SmolVLA with a local
  backbone: the run record counts exactly the adapters' rank x (in + out) per adapted layer; the saved
  `model.safetensors` has the plain policy's keys and nothing of PEFT, LeRobot's `from_pretrained` reads it; each
  adapted layer moved by an update of the adapters' rank, every other weight stayed as it was.
- The merge: a layer with adapters and the plain layer with the merged weight give the same outputs.
- frozen_backbone on ACT: its ResNet is the initial one after training, the rest moved, the record says so.
- Settings that would do nothing, and families or targets that cannot, are refused with the reason."""

from __future__ import annotations

import json
import re
import types

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from roboloop.training import finetune
from roboloop.training.config import TrainConfig
from roboloop.training.train import train
from tests.conformance.cases import LEROBOT_QUIET, lerobot_writer
from tests.unit.policies.test_lerobot_family import CAMS, SMALL_ACT, _losses
from tests.unit.policies.tiny_vlm import SMALL_SMOLVLA, tiny_smolvlm
from tests.unit.training.conftest import kill9_at_step

pytestmark = LEROBOT_QUIET


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune") / "ds"
    lerobot_writer(CAMS, {}, ["pick the cube", "put the cube in the bowl"], num_episodes=3)(root)
    return root


def _cfg(ds, out, **kw) -> TrainConfig:
    return TrainConfig(**{"dataset": str(ds), "output_dir": str(out), "steps": 4, "max_samples": 4,
                          "warmup_steps": 1, "lr": 1e-2, "checkpoint_every_steps": 0, "num_workers": 1, **kw})


def _run(out) -> dict:
    return json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["run"]


def test_lora_trains_the_adapters_only_and_saves_a_plain_model_lerobot_reads(recorded, tmp_path):
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    from roboloop.training import checkpoint

    vlm = tiny_smolvlm(tmp_path / "SmolVLM2-tiny", weights=True)
    out = tmp_path / "lora"
    train(_cfg(recorded, out, policy_type="smolvla", policy_config={**SMALL_SMOLVLA, "vlm_model_name": str(vlm)},
               finetune="lora", lora_rank=4, lora_alpha=8, checkpoint_every_steps=2))
    saved = load_file(out / "model.safetensors")
    fresh = SmolVLAPolicy.from_pretrained(str(out))  # LeRobot's own loader: the plain policy's keys, all of them
    assert set(saved) == set(fresh.state_dict()) and not any("lora" in k or "base_layer" in k for k in saved)
    pattern = fresh._get_default_peft_targets()["target_modules"]
    adapted = {n: m for n, m in fresh.named_modules() if isinstance(m, nn.Linear) and re.fullmatch(pattern, n)}
    rec = _run(out)["parameters"]
    assert rec["trainable"] == sum(4 * (m.in_features + m.out_features) for m in adapted.values()) > 0
    assert rec["total"] == sum(p.numel() for p in fresh.parameters()) + rec["trainable"]
    assert rec["finetune"] == {"mode": "lora", "rank": 4, "alpha": 8, "targets": pattern, "layers": len(adapted)}
    # the step-2 checkpoint holds the adapters (B trained away from 0) beside the frozen weight; the saved weight
    # is that weight plus a merged update of rank 4 (SmolVLA's expert is bf16: beyond 4, rounding's singular values)
    held = checkpoint.load(out / "checkpoints" / "step-00000002")["model"]
    for n in adapted:
        base, b = held[f"policy.{n}.base_layer.weight"], held[f"policy.{n}.lora_B.default.weight"]
        assert b.abs().sum() > 0, n
        sv = torch.linalg.svdvals((saved[f"{n}.weight"] - base).float())
        assert sv[0] > 0 and int((sv > 0.01 * sv[0]).sum()) <= 4, (n, sv[:6])
    # everything else, the VLM included, is as the run held it at step 2: frozen
    rest = [k for k in saved if k.removesuffix(".weight") not in adapted and k.removesuffix(".bias") not in adapted]
    assert any(k.startswith("model.vlm_with_expert.vlm.") for k in rest)
    assert all(torch.equal(saved[k], held[f"policy.{k}"]) for k in rest)


def test_merged_weights_act_as_the_adapters_did():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    plain = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    cfg = types.SimpleNamespace(finetune="lora", lora_rank=2, lora_alpha=6, lora_targets=None)
    rec = finetune._lora(net, r"0|2", cfg.lora_rank, finetune._alpha(cfg))
    assert rec["layers"] == 2 and all(p.requires_grad == ("lora_" in n) for n, p in net.named_parameters())
    with torch.no_grad():
        for n, p in net.named_parameters():
            if "lora_B" in n:
                p.normal_()  # B starts at zero: give the adapters something to merge
    plain.load_state_dict(finetune.merged(net.state_dict(), cfg))
    x = torch.randn(5, 8)
    assert torch.allclose(net(x), plain(x), atol=1e-5)


def test_frozen_backbone_keeps_acts_resnet_and_trains_the_rest(recorded, tmp_path):
    from lerobot.policies.act.modeling_act import ACTPolicy

    # two runs from the same seed (the same initial weights) at two learning rates: what trains differs, what is
    # frozen cannot
    for name, lr in (("fast", 1e-2), ("slow", 1e-3)):
        train(_cfg(recorded, tmp_path / name, policy_type="act", policy_config=SMALL_ACT, lr=lr,
                   finetune="frozen_backbone"))
    fast, slow = (ACTPolicy.from_pretrained(str(tmp_path / n)) for n in ("fast", "slow"))
    rec = _run(tmp_path / "fast")["parameters"]
    backbone = {n for n, _ in fast.named_parameters() if n.startswith("model.backbone.")}
    assert backbone and rec["finetune"] == {"mode": "frozen_backbone", "backbone": "model.backbone"}
    a, b = fast.state_dict(), slow.state_dict()
    assert all(torch.equal(a[n], b[n]) for n in backbone)
    assert not torch.equal(a["model.action_head.weight"], b["model.action_head.weight"])
    assert rec["trainable"] == rec["total"] - sum(p.numel() for n, p in fast.named_parameters() if n in backbone)


def test_what_would_do_nothing_or_cannot_be_done_is_refused(recorded, tmp_path):
    with pytest.raises(ValueError, match="lora_rank=8 would do nothing: it shapes LoRA's adapters, and finetune is "
                                         "full"):
        _cfg(recorded, tmp_path / "a", lora_rank=8)
    with pytest.raises(ValueError, match="finetune='lora' would do nothing: family vla trains from scratch here"):
        _cfg(recorded, tmp_path / "b", finetune="lora")
    with pytest.raises(ValueError, match="no default LoRA targets; set lora_targets"):
        train(_cfg(recorded, tmp_path / "c", policy_type="act", policy_config=SMALL_ACT, finetune="lora"))
    with pytest.raises(ValueError, match="matches no linear layer"):
        train(_cfg(recorded, tmp_path / "d", policy_type="act", policy_config=SMALL_ACT, finetune="lora",
                   lora_targets=r".*\.nothing_here"))


def test_a_lora_run_killed_mid_run_resumes_exactly(recorded, tmp_path):
    """The checkpoints hold the adapters and their optimizer state: a LoRA fine-tune killed with -9 resumes from its
    last checkpoint to the same losses and the same merged model as a run never stopped."""
    from roboloop.training import checkpoint

    vlm = tiny_smolvlm(tmp_path / "SmolVLM2-tiny", weights=True)
    kw = dict(policy_type="smolvla", policy_config={**SMALL_SMOLVLA, "vlm_model_name": str(vlm)}, finetune="lora",
              lora_rank=4, steps=8, checkpoint_every_steps=2, deterministic=True)
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    train(_cfg(recorded, ref, **kw))
    cfg = _cfg(recorded, killed, **kw)
    kill9_at_step(cfg, 5)
    assert not (killed / "model.safetensors").exists()
    last = int(checkpoint.latest(killed / "checkpoints").name.split("-")[1])
    assert 2 <= last < 8 and train(cfg).resumed_from == last
    assert _losses(killed) == _losses(ref)
    ours, theirs = load_file(killed / "model.safetensors"), load_file(ref / "model.safetensors")
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
