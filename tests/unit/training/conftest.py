"""Training fixtures shared by the trainer's test modules."""

from __future__ import annotations

import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21


@pytest.fixture(scope="module")
def tiny_v3(tmp_path_factory):
    """Three short episodes with one 32x32 video camera, converted to v3 (read-only: copy before damaging)."""
    root = tmp_path_factory.mktemp("train")
    src = generate_v21(root / "v21", GenSpec(num_episodes=3, min_length=16, max_length=24,
                                            cameras={"observation.images.top": (32, 32)}, seed=4))
    return convert(src, root / "v3", ConvertConfig(progress=False))
