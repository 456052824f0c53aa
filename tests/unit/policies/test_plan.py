"""`roboloop plan`: a fine-tune sized before it runs, from the real configuration built on the meta device.

The measurements are checked on models whose figures are known by hand (a linear layer and tanh: what autograd
keeps, what the matmuls cost; blocks under activation checkpointing); the counts against the meta-device model's
own parameters; the memory per GPU against the rule it states; the command's verdict against a π0.5 that cannot
fit one 40 GB GPU and one that fits eight 80 GB GPUs."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch import nn

from roboloop.policies import foundation
from roboloop.training import plan

WIDTH = 1000


def _blocks(n: int, ac: bool, device: str = "cpu", depth: int = 1):
    """`n` blocks of `depth` linear layers with tanh, each checkpointed where `ac`."""
    blocks = nn.ModuleList(nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(WIDTH, WIDTH, device=device),
                                                                              nn.Tanh())]) for _ in range(n))

    def loss(b: int) -> torch.Tensor:
        x = torch.zeros(b, WIDTH, device=device)
        for blk in blocks:
            x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False) if ac else blk(x)  # as LeRobot calls it
        return x.sum()

    return blocks, loss


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_sample_keeps_what_autograd_saves_and_costs_its_matmuls(device):
    # one block: the linear keeps its input for the weight's gradient, tanh its output; 4 bytes each per feature;
    # the forward matmul and the weight-gradient matmul, 2 x 1000 x 1000 FLOPs each (the input needs no gradient)
    _, loss = _blocks(1, ac=False, device=device)
    assert plan.per_sample(loss, trains=True) == {"activation_bytes": 2 * 4 * WIDTH, "flops": 2 * 2 * WIDTH * WIDTH}
    assert plan.per_sample(loss, trains=False)["flops"] == 2 * WIDTH * WIDTH  # nothing trained: the forward only


def test_checkpointed_blocks_keep_their_inputs_and_one_block_at_a_time():
    # four blocks of two linear+tanh layers: the input and 8 outputs of 4,000 bytes a sample (a layer's output is
    # the next one's saved input: one tensor); checkpointed, each block keeps its input and the backward pass
    # recomputes one block at a time (its two new tensors)
    blocks, loss = _blocks(4, ac=False, depth=2)
    _, ac_loss = _blocks(4, ac=True, depth=2)
    assert plan.per_sample(loss, True)["activation_bytes"] == 9 * 4 * WIDTH
    assert plan.per_sample(ac_loss, True)["activation_bytes"] == 4 * 4 * WIDTH + 2 * 4 * WIDTH
    assert plan.largest_block(nn.Sequential(blocks)) == 2 * (WIDTH * WIDTH + WIDTH)


def test_memory_per_gpu_follows_the_stated_rule():
    counts = {"params": 3_000_000_000, "trainable": 1_000_000_000, "frozen": 2_000_000_000}
    gb = 1e9
    fsdp = plan.memory(counts, block=100_000_000, act_per_sample=2 * gb, gpus=16, gpu_memory_gb=80,
                       strategy="fsdp", precision="bf16")
    # fp32 masters, gradients and Adam's two moments of the trained billion, the frozen two in bf16; over 16 GPUs
    assert fsdp["weights"] == (4e9 + 2 * 2e9) // 16 and fsdp["gradients"] == 4e9 // 16
    assert fsdp["optimizer"] == 8e9 // 16 and fsdp["gathered_blocks"] == 2 * 2 * 100_000_000
    left = 80 * gb - (0.08 * 80 * gb + 2 * 2**30) - (8e9 + 4e9 + 8e9) / 16 - 4e8
    assert fsdp["max_micro_batch"] == int(left // (2 * gb)) == 34
    hsdp = plan.memory(counts, 100_000_000, 2 * gb, 16, 80, "hsdp", "bf16")
    assert hsdp["shards"] == 8 and hsdp["optimizer"] == 8e9 // 8  # sharded in a node, replicated across
    ddp = plan.memory(counts, 100_000_000, 2 * gb, 16, 80, "ddp", "fp32")
    assert ddp["weights"] == 4e9 + 4 * 2e9 and ddp["gathered_blocks"] == 0  # fp32: frozen weights in fp32 too
    assert plan.verdict(ddp, 16, 80) is None
    small = plan.memory(counts, 100_000_000, 2 * gb, 1, 24, "ddp", "bf16")
    assert small["max_micro_batch"] == 0
    assert re.match(r"does not fit: one sample needs 2\.0 GB .* on 1 GPU\(s\) \(the weights take 8\.0 GB\)",
                    plan.verdict(small, 1, 24))


@pytest.fixture(scope="module")
def pi05():
    return foundation.build("pi05")


def test_what_each_mode_trains_is_counted_from_the_model(pi05):
    own = {n: p.numel() for n, p in pi05.policy.named_parameters()}
    assert foundation.freeze(pi05, "full") == {"params": sum(own.values()), "trainable": sum(own.values()),
                                               "adapters": 0, "frozen": 0}
    assert 4.0e9 < sum(own.values()) < 4.3e9  # LeRobot's π0.5 as built: Gemma 2B, SigLIP so400m, Gemma 300M
    frozen = foundation.freeze(pi05, "frozen_backbone")
    backbone = sum(v for n, v in own.items() if n.startswith("model.paligemma_with_expert.paligemma."))
    assert frozen["frozen"] == backbone and frozen["trainable"] == sum(own.values()) - backbone
    assert not any(p.requires_grad for n, p in pi05.policy.named_parameters() if "vision_tower" in n)
    # LoRA where LeRobot puts it for lerobot-train --peft: the expert's attention q and v, the action projections
    lora8, lora16 = foundation.freeze(pi05, "lora", rank=8), foundation.freeze(pi05, "lora", rank=16)
    linears = [m for n, m in pi05.policy.named_modules() if isinstance(m, nn.Linear)
               and (re.fullmatch(r".*\.gemma_expert\..*\.self_attn\.(q|v)_proj", n)
                    or n in ("model.action_in_proj", "model.action_out_proj"))]
    assert lora8["adapters"] == sum(8 * (m.in_features + m.out_features) for m in linears) > 0
    assert lora8["trainable"] == lora8["adapters"] and lora16["adapters"] == 2 * lora8["adapters"]
    mlp = foundation.freeze(pi05, "lora", rank=8, targets=r".*\.gemma_expert\..*\.mlp\.(gate|up|down)_proj")
    assert mlp["adapters"] == 18 * 8 * 3 * (1024 + 4096)  # the 300M expert's 18 MLPs: 3 projections, 1024 <-> 4096
    with pytest.raises(ValueError, match="match no linear layer"):
        foundation.freeze(pi05, "lora", targets="nothing")
    # checkpointing each layer keeps a fraction of the activations
    foundation.freeze(pi05, "full")
    full = plan.per_sample(pi05.loss, True)["activation_bytes"]
    ac = foundation.build("pi05", activation_checkpointing=True)
    assert 0 < plan.per_sample(ac.loss, True)["activation_bytes"] < full / 4


def test_a_pretrained_folder_decides_the_shapes_and_a_missing_one_says_what_to_fetch(tmp_path):
    from lerobot.configs.types import FeatureType, PolicyFeature

    cfg = foundation.lerobot_config("pi05", cameras=3, state_dim=14, action_dim=14)
    cfg.device = "cpu"
    (tmp_path / "pi05").mkdir()
    cfg._save_pretrained(tmp_path / "pi05")  # LeRobot's own writer: config.json as a policy folder holds it
    built = foundation.build("pi05", tmp_path / "pi05")
    assert built.tokens_per_sample == 3 * 256 + 200 + 50  # three cameras' patches, the instruction, the chunk
    assert built.config.input_features["observation.state"] == PolicyFeature(type=FeatureType.STATE, shape=(14,))
    with pytest.raises(FileNotFoundError, match=r"no config\.json there; fetch .*lerobot/pi05_base --local-dir"):
        foundation.build("pi05", tmp_path / "nothing")
    with pytest.raises(ValueError, match="is a 'pi05' policy, not 'pi0'"):
        foundation.build("pi0", tmp_path / "pi05")
    # LeRobot's config takes a Gemma 300M backbone, its forward does not (image tokens 2048 wide, text 1024)
    small = foundation.lerobot_config("pi05")
    small.device, small.paligemma_variant = "cpu", "gemma_300m"
    (tmp_path / "small").mkdir()
    small._save_pretrained(tmp_path / "small")
    with pytest.raises(ValueError, match="paligemma_variant='gemma_300m'.*only a gemma_2b backbone runs"):
        foundation.build("pi05", tmp_path / "small")
    for refused, why in (("groot", "Qwen3-VL backbone by loading"), ("xvla", "data-dependent")):
        with pytest.raises(ValueError, match=why):
            foundation.build(refused)


def _plan(capsys, *args: str) -> tuple[int, dict, str]:
    """`roboloop plan` as its command line runs it, in this process (LeRobot imported once for the module)."""
    from roboloop.cli.main import main

    capsys.readouterr()
    code = main(["plan", "--policy-type", "pi05", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out.strip().splitlines()[-1]), err


def test_plan_refuses_what_cannot_fit_and_projects_what_can(capsys):
    code, out, err = _plan(capsys, "--gpus", "1", "--strategy", "ddp", "--gpu-memory-gb", "40")
    n = out["counts"]["params"]
    assert code == 2 and not out["fits"] and out["memory"]["max_micro_batch"] == 0
    assert out["memory"]["optimizer"] == 8 * n and out["memory"]["weights"] == 4 * n  # full fine-tune, unsharded
    assert err.strip().splitlines()[-1].startswith("roboloop plan: does not fit: one sample needs"), err[-500:]
    code, out, err = _plan(capsys, "--gpus", "8", "--strategy", "fsdp", "--frames", "80000")
    t = out["throughput"]
    assert code == 0 and out["fits"] and out["memory"]["optimizer"] == 8 * n // 8
    assert 1 <= out["micro_batch"] == min(out["memory"]["max_micro_batch"], 32)
    # the scale model's step at 0.35 of 989 TFLOP/s: FLOPs per sample x micro-batch, within one node (no loss)
    step_s = out["micro_batch"] * out["flops_per_sample"] / (989e12 * 0.35)
    assert t["step_ms"] == pytest.approx(step_s * 1e3, rel=1e-3) and t["efficiency"] == 1.0
    assert t["minutes_per_epoch"] == pytest.approx(80000 / t["samples_per_s"] / 60, rel=1e-2)
    assert "largest micro-batch per GPU" in err and err.strip().endswith("fits")
