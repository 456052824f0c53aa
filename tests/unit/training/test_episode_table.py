"""Training refuses what `roboloop validate` refuses: an episode table that disagrees with the data rows.

Each defect was tried on the landed code: `validate` named it, while `train` exited 0 having trained on
the wrong windows (another episode's frames, frames past an episode's end, an episode twice) or crashed
with "list index out of range". Now every reader of a v3 dataset checks the table first.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roboloop.datasets.convert import ConvertConfig, convert
from roboloop.datasets.generate import GenSpec, generate_v21
from roboloop.datasets.validate import validate
from roboloop.training.config import TrainConfig
from roboloop.training.data import EpisodeTableError, V3Dataset
from roboloop.training.train import train


@pytest.fixture(scope="module")
def v3(tmp_path_factory):
    root = tmp_path_factory.mktemp("eptable")
    src = generate_v21(root / "v21", GenSpec(num_episodes=4, min_length=10, max_length=14, cameras={}, seed=3))
    return convert(src, root / "v3", ConvertConfig(progress=False))


def _edit(root, fn: Callable[[list[dict]], list[dict]]) -> None:
    path = next((root / "meta" / "episodes").rglob("*.parquet"))
    table = pq.read_table(path)
    rows = fn(table.to_pylist())
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)


def _shift(rows):
    rows[1]["dataset_from_index"] += 3
    rows[1]["dataset_to_index"] += 3
    return rows


def _duplicate(rows):
    return [*rows[:2], dict(rows[1]), *rows[2:]]


def _too_long(rows):
    rows[1]["length"] += 5
    rows[1]["dataset_to_index"] += 5
    return rows


def _empty(rows):
    rows[2]["length"] = 0
    rows[2]["dataset_to_index"] = rows[2]["dataset_from_index"]
    return rows


def _dropped(rows):
    return rows[:2] + rows[3:]


def _swapped(rows):
    a, b = rows[0], rows[1]
    a["dataset_from_index"], b["dataset_from_index"] = b["dataset_from_index"], a["dataset_from_index"]
    a["dataset_to_index"], b["dataset_to_index"] = b["dataset_to_index"], a["dataset_to_index"]
    return rows


@pytest.mark.parametrize("edit", [_shift, _duplicate, _too_long, _empty, _dropped, _swapped], ids=lambda f: f.__name__)
def test_train_refuses_what_validate_refuses(v3, tmp_path, edit):
    import shutil

    ds = shutil.copytree(v3, tmp_path / "ds")
    _edit(ds, edit)
    assert not validate(ds).ok
    with pytest.raises(EpisodeTableError, match=r"episode|rows"):
        V3Dataset(ds)
    with pytest.raises(EpisodeTableError):
        train(TrainConfig(dataset=str(ds), output_dir=str(tmp_path / "out"), steps=2, max_tokens=512,
                          checkpoint_every_steps=0, with_video=False))


def test_an_intact_table_loads(v3):
    ds = V3Dataset(v3)
    assert len(ds) == sum(ep.length for ep in ds.meta.episodes)


def test_nan_in_the_data_is_named_before_training(v3, tmp_path):
    """It used to stop training with 'NonFiniteLossError ... (unexpected)' at the first batch that held it."""
    import shutil

    import numpy as np

    from roboloop.errors import CorruptFileError

    ds = shutil.copytree(v3, tmp_path / "ds")
    path = next((ds / "data").rglob("*.parquet"))
    t = pq.read_table(path)
    vals = np.asarray(t["action"].to_pylist(), dtype=np.float32)
    ep, frame = int(t["episode_index"][15].as_py()), int(t["frame_index"][15].as_py())
    vals[15, 0] = np.nan
    i = t.column_names.index("action")
    pq.write_table(t.set_column(i, "action", pa.FixedSizeListArray.from_arrays(pa.array(vals.ravel()),
                                                                               vals.shape[1])), path)
    with pytest.raises(CorruptFileError, match=f"action is NaN or infinite in episode {ep} frame {frame}"):
        train(TrainConfig(dataset=str(ds), output_dir=str(tmp_path / "out"), steps=2, max_tokens=512,
                          checkpoint_every_steps=0, with_video=False))
