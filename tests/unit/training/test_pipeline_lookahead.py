"""The pipeline's lookahead (the batch after the next one planned, its decoding started, one step early: the
default on CUDA) changes when frames are decoded, never which batches arrive or where a checkpoint resumes."""

from __future__ import annotations

import torch

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.training.data import SampleStream, V3Dataset
from roboloop.training.pipeline import BatchPipeline, Packer


def _run(v3, lookahead: bool, n: int = 7, resume: dict | None = None) -> tuple[list[dict], list[dict]]:
    ds = V3Dataset(v3)
    ds.horizon = 8
    stream = SampleStream(ds, (32, 32), 64, seed=3, window=4)
    packer = Packer(stream, 512, 64, 3)
    if resume is not None:
        stream.load_state_dict(resume)
    pipe = BatchPipeline(packer, stream, 0, 1, 4, torch.device("cpu"), lookahead=lookahead)
    assert pipe.lookahead is lookahead
    batches, states = [], []
    for _ in range(n):
        ready = pipe.next()
        pipe.prepare_next()
        states.append(pipe.state_dict())  # what a checkpoint after this step records
        batches.append({k: v.clone() for k, v in vars(ready.batch).items()})
    stream.close()
    return batches, states


def test_lookahead_gives_the_same_batches_and_resume_points(tmp_path):
    src = generate_v21(tmp_path / "v21", GenSpec(num_episodes=3, min_length=16, max_length=24,
                                                 cameras={"observation.images.top": (32, 32)}, seed=4))
    v3 = convert(src, tmp_path / "v3", ConvertConfig(progress=False))
    plain, plain_states = _run(v3, False)
    ahead, ahead_states = _run(v3, True)
    assert plain_states == ahead_states
    for a, b in zip(plain, ahead, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # resuming from the state recorded after step 3 (with a batch planned ahead) continues with step 4's batch
    resumed, _ = _run(v3, True, n=3, resume=ahead_states[2])
    for a, b in zip(plain[3:6], resumed, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
