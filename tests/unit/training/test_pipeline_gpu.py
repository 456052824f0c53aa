"""The CUDA double buffer (pinned memory, side-stream copies) delivers exactly the CPU pipeline's batches."""

from __future__ import annotations

import pytest
import torch

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.training.data import SampleStream, V3Dataset
from roboloop.training.pipeline import BatchPipeline, Packer

pytestmark = pytest.mark.gpu


def _batches(v3, device: str, n: int = 6) -> list[dict]:
    ds = V3Dataset(v3)
    ds.horizon = 8
    stream = SampleStream(ds, (32, 32), 64, seed=3)
    pipe = BatchPipeline(Packer(stream, 512, 64, 4), stream, 0, 1, 4, torch.device(device))
    out = []
    for _ in range(n):
        ready = pipe.next()
        pipe.prepare_next()
        out.append({k: v.cpu() for k, v in vars(ready.batch).items()})
    stream.close()
    return out


def test_cuda_double_buffer_equals_cpu(tmp_path):
    src = generate_v21(tmp_path / "v21", GenSpec(num_episodes=3, min_length=16, max_length=24,
                                                 cameras={"observation.images.top": (32, 32)}, seed=4))
    v3 = convert(src, tmp_path / "v3", ConvertConfig(progress=False))
    for a, b in zip(_batches(v3, "cpu"), _batches(v3, "cuda"), strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
