"""Arrow columns as numpy: scalar and list columns of a parquet table as (N, D) arrays."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def to_2d(col: pa.ChunkedArray | pa.Array, dtype: type = np.float64) -> np.ndarray:
    """(N, D) array of a list column (D = list length) or (N, 1) of a scalar column."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if is_list(col.type):
        flat: np.ndarray = np_col(col.flatten()).astype(dtype)
        return flat.reshape(len(col), -1)
    return np_col(col).astype(dtype)[:, None]


def read_table(path, columns: list[str] | None = None, memory_map: bool = False) -> pa.Table:
    """`pq.read_table` without `pyarrow.dataset`, which imports pandas (~1 s of start-up) when installed."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path, memory_map=memory_map) as f:
        return f.read(columns=columns)


_NUMPY_TYPES = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
                pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
                pa.float16(): np.float16, pa.float32(): np.float32, pa.float64(): np.float64}


def np_col(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column as a (read-only) numpy array.

    pyarrow's `to_numpy` asks its pandas shim whether pandas is installed, which imports pandas
    (~1 s): `roboloop validate` must start fast, so fixed-width columns without nulls are viewed
    straight from their buffer.
    """
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    dtype = _NUMPY_TYPES.get(col.type)
    if dtype is not None and col.null_count == 0:
        itemsize = np.dtype(dtype).itemsize
        return np.frombuffer(col.buffers()[1], dtype=dtype, count=len(col), offset=col.offset * itemsize)
    return col.to_numpy(zero_copy_only=False)


def tasks_table(tasks: dict[int, str]) -> pa.Table:
    """meta/tasks.parquet as LeRobot writes it with pandas (`DataFrame({"task_index": ...}, index=task)`): a
    `task_index` column, the task strings as the `task` index column and the pandas metadata that makes
    `pd.read_parquet` restore that index. Built without importing pandas (~0.4 s of a conversion's wall time);
    `tests/unit/datasets/test_convert.py` checks that pandas reads it back like its own file."""
    import json
    from importlib.metadata import version

    pandas_md = {
        "index_columns": ["task"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
             "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object",
             "metadata": None},
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": version("pandas"),
    }
    schema = pa.schema([("task_index", pa.int64()), ("task", pa.string())],
                       metadata={b"pandas": json.dumps(pandas_md).encode()})
    return pa.table([pa.array(list(tasks), pa.int64()), pa.array(list(tasks.values()), pa.string())],
                    schema=schema)
