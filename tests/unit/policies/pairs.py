"""What the same-batch tests of LeRobot's policies share: roboloop's batch and LeRobot's own for the same frames,
and a policy's loss under a fixed seed (so that two batches are compared on the same noise and latents)."""

from __future__ import annotations

import torch


def roboloop_batch(ds, trainable, keys: list[int], **stream: object) -> dict:
    """The batch roboloop's loader and the policy family give for frames `keys` (`stream`: SampleStream's options,
    e.g. cameras=, history=, env_state=)."""
    from roboloop.training.data import SampleStream
    from roboloop.training.packing import collate

    s = SampleStream(ds, None, 1, num_workers=1, **stream)
    try:
        return trainable.batch(collate(s.materialize(keys), 0))
    finally:
        s.close()


def lerobot_batch(root, keys: list[int], delta_timestamps: dict, fields) -> dict:
    """LeRobot's `LeRobotDataset` items for the same frames, stacked as its DataLoader stacks them (`fields`), with
    their task strings."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    lr = LeRobotDataset("conformance/writer", root=root, delta_timestamps=delta_timestamps)
    items = [lr[k] for k in keys]
    return {**{k: torch.stack([it[k] for it in items]) for k in fields}, "task": [it["task"] for it in items]}


def seeded_loss(policy, preprocessor, batch: dict, seed: int = 1) -> tuple[float, dict]:
    """The policy's loss on `batch` (through its LeRobot preprocessor) with torch seeded first, gradients off."""
    with torch.no_grad():
        torch.manual_seed(seed)
        loss, info = policy.forward(preprocessor(batch))
    return float(loss), info or {}


def assert_same_loss(a: float, b: float, what: object = None) -> None:
    assert abs(a - b) <= 1e-3 * abs(b), (what, a, b)
