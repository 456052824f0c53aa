"""The validation split: by episode, recorded with the model, never trained on; init_from continues a model."""

from __future__ import annotations

import json

import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.errors import ModelMismatchError
from roboloop.training.config import TrainConfig
from roboloop.training.data import SampleStream, V3Dataset
from roboloop.training.split import split_episodes
from roboloop.training.train import train


def test_split_is_deterministic_disjoint_and_complete():
    eps = list(range(20))
    tr, va = split_episodes(eps, 0.2, seed=3)
    assert len(va) == 4 and set(tr) | set(va) == set(eps) and not set(tr) & set(va)
    assert split_episodes(eps, 0.2, seed=3) == (tr, va)
    assert split_episodes(eps, 0.2, seed=4)[1] != va
    assert split_episodes(eps, 0.0) == (eps, [])
    assert len(split_episodes([5, 9, 11], 0.01)[1]) == 1  # a positive fraction holds out at least one
    with pytest.raises(ValueError, match="no episode to train on"):
        split_episodes([1, 2], 0.9)


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    root = tmp_path_factory.mktemp("split")
    src = generate_v21(root / "v21", GenSpec(num_episodes=6, min_length=10, max_length=14, cameras={}, seed=2))
    return convert(src, root / "v3", ConvertConfig(progress=False))


def test_stream_never_yields_a_held_out_episode(v3):
    ds = V3Dataset(v3, horizon=4)
    tr, va = split_episodes(list(range(6)), 0.34, seed=0)
    s = SampleStream(ds, (16, 16), 32, window=4, shuffle_buffer=8, with_video=False, episodes=tr)
    seen = {int(ds.episode_index[s.next_key()]) for _ in range(600)}  # several epochs
    s.close()
    assert seen == set(tr) and not seen & set(va)


def _cfg(ds, out, **kw) -> TrainConfig:
    return TrainConfig(**{"dataset": str(ds), "output_dir": str(out), "max_tokens": 512, "steps": 6,
                          "checkpoint_every_steps": 0, "with_video": False, "warmup_steps": 1,
                          "model_overrides": {"horizon": 4, "dim": 32, "head_dim_model": 32}, **kw})


def test_model_records_its_split_and_init_from_continues(v3, tmp_path):
    train(_cfg(v3, tmp_path / "a", val_fraction=0.34, seed=1))
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    want = split_episodes(list(range(6)), 0.34, seed=1)
    assert (cfg["split"]["train_episodes"], cfg["split"]["validation_episodes"]) == (list(want[0]), list(want[1]))
    # a continued run starts from a's weights and keeps a's normalisation
    stats_a = json.loads((tmp_path / "a" / "stats.json").read_text())
    stats_a["action"]["mean"] = [m + 1.0 for m in stats_a["action"]["mean"]]  # as if a saw other data
    (tmp_path / "a" / "stats.json").write_text(json.dumps(stats_a))
    train(_cfg(v3, tmp_path / "b", init_from=str(tmp_path / "a"), steps=1, lr=1e-12))
    assert json.loads((tmp_path / "b" / "stats.json").read_text())["action"]["mean"] == stats_a["action"]["mean"]
    from safetensors.torch import load_file

    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6  # lr 1e-12: b is a
    with pytest.raises(ModelMismatchError, match="dim"):
        train(_cfg(v3, tmp_path / "c", init_from=str(tmp_path / "a"),
                   model_overrides={"horizon": 4, "dim": 64, "head_dim_model": 32}))


def test_uniform_order_is_a_seeded_permutation_of_the_split_every_epoch_and_resumes_exactly(v3):
    ds = V3Dataset(v3, horizon=4)
    tr, _ = split_episodes(list(range(6)), 0.34, seed=0)
    ep = ds.episode_index.astype(int)
    kept = [k for k in range(len(ds)) if ep[k] in tr and ds.frame_index[k] < ds.ep_to[ep[k]] - ds.ep_from[ep[k]] - 2]

    def stream(order="uniform", seed=5):
        return SampleStream(ds, None, 32, window=4, shuffle_buffer=8, with_video=False, episodes=tr, seed=seed,
                            drop_last=2, order=order)

    s = stream()
    n = len(kept)
    first, second = [s.next_key() for _ in range(n)], [s.next_key() for _ in range(n)]
    assert sorted(first) == kept == sorted(second) and first != second  # every frame once an epoch, reshuffled
    again, other = stream(), stream(seed=6)
    assert [again.next_key() for _ in range(n)] == first and [other.next_key() for _ in range(n)] != first
    assert s.order_record() == {"sample_order": "uniform"} and f"permutation of the split's {n} frames" in \
        s.order_line()
    w = stream("windows")  # the buffer spans epochs: the same frames, not one epoch per n keys
    assert {w.next_key() for _ in range(3 * n)} == set(kept) and "windows of 4" in w.order_line()
    # exact resume mid-epoch
    full = stream()
    want = [full.next_key() for _ in range(n + 20)]
    a = stream()
    head = [a.next_key() for _ in range(n - 3)]
    b = stream()
    b.load_state_dict(a.state_dict())
    assert head + [b.next_key() for _ in range(23)] == want
    # a checkpoint from before orders had names continues in the windows order it began with
    w = stream("windows")
    [w.next_key() for _ in range(10)]
    old = w.state_dict()
    del old["order"]
    c = stream("uniform")
    c.load_state_dict(old)
    assert c.order == "windows" and [c.next_key() for _ in range(30)] == [w.next_key() for _ in range(30)]
    with pytest.raises(ValueError, match="sample order 'random'"):
        stream("random")


def test_sample_order_auto_is_uniform_without_a_camera_and_windows_with_one(v3):
    from roboloop.training.train import sample_order

    act = TrainConfig(dataset=str(v3), policy_type="act")
    assert sample_order(act, with_video=False) == "uniform" and sample_order(act, with_video=True) == "windows"
    vla = TrainConfig(dataset=str(v3))
    assert sample_order(vla, with_video=False) == "uniform" and sample_order(vla, with_video=True) == "windows"
    assert sample_order(vla.model_copy(update={"sample_order": "uniform"}), True) == "uniform"
    assert sample_order(act.model_copy(update={"sample_order": "windows"}), False) == "windows"


def test_a_shuffle_buffer_is_refused_where_the_order_has_none(v3):
    """A uniform order is one permutation of the split's frames: a shuffle buffer set for it would do nothing."""
    from roboloop.training.train import sample_order

    vla = TrainConfig(dataset=str(v3), shuffle_buffer=1024)
    with pytest.raises(ValueError, match=r"shuffle_buffer 1024: .*\(sample_order auto, no camera fed\).*"
                                         "set sample_order windows"):
        sample_order(vla, with_video=False)
    with pytest.raises(ValueError, match=r"\(sample_order uniform\)"):
        sample_order(vla.model_copy(update={"sample_order": "uniform"}), with_video=True)
    assert sample_order(vla, with_video=True) == "windows"  # a camera is fed: the buffer mixes its windows
    assert sample_order(vla.model_copy(update={"sample_order": "windows"}), with_video=False) == "windows"
    assert sample_order(TrainConfig(dataset=str(v3)), with_video=False) == "uniform"  # the default buffer: fine
