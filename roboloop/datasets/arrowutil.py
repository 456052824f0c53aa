"""Arrow columns as numpy: scalar and list columns of a parquet table as (N, D) arrays."""

from __future__ import annotations

import json

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


def to_rows_nd(col: pa.ChunkedArray | pa.Array, dtype: type = np.float64) -> list[np.ndarray | None]:
    """Each row of a (nested) list or scalar column as an at-least-1-d array, None for a null row: what
    `np.atleast_1d(np.asarray(row, dtype))` gives for each of `col.to_pylist()`, from one conversion when every
    row has the same shape (the episode table's 30 stats columns x 1000s of episodes, ~0.2 s row by row)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    shape: list[int] = [len(col)]
    flat: pa.Array = col
    while is_list(flat.type):
        if flat.null_count:
            break
        lengths = np_col(flat.value_lengths())
        if len(lengths) == 0 or (lengths != lengths[0]).any():
            break
        shape.append(int(lengths[0]))
        flat = flat.flatten()
    else:
        if flat.null_count == 0 and flat.type in _NUMPY_TYPES:
            arr: np.ndarray = np_col(flat).astype(dtype).reshape(shape)
            return [np.atleast_1d(a) for a in arr]
    return [None if v is None else np.atleast_1d(np.asarray(v, dtype=dtype)) for v in col.to_pylist()]


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
    table = rows_table([{"task_index": i, "task": t} for i, t in tasks.items()],
                       pa.schema([("task_index", pa.int64()), ("task", pa.string())]))
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_md).encode()})


def infer_type(value) -> pa.DataType:
    """The Arrow type `pa.Table.from_pylist` infers for a JSON-like value (bool, int, float, str, nested lists)."""
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    if isinstance(value, str):
        return pa.string()
    if isinstance(value, list | tuple):
        kinds = {infer_type(v) for v in value}
        if kinds == {pa.int64(), pa.float64()}:
            return pa.list_(pa.float64())
        if len(kinds) > 1:
            raise TypeError(f"mixed list {value!r:.80}")
        return pa.list_(kinds.pop() if kinds else pa.null())
    raise TypeError(f"no Arrow type for {type(value).__name__}")


def rows_table(rows: list[dict], schema: pa.Schema | None = None) -> pa.Table:
    """`pa.Table.from_pylist(rows)` through Arrow's JSON reader: every Python-object path into pyarrow (pa.array,
    from_pylist, from_pydict) imports pandas, which was a tenth of a conversion's wall time. The schema is the
    one from_pylist infers from the first row (`infer_type`) unless given; floats go through their shortest
    repr, which parses back to the same double. Non-finite numbers are refused (JSON has none)."""
    import io

    import pyarrow.json as pj

    if schema is None:
        schema = pa.schema([(k, infer_type(v)) for k, v in rows[0].items()])
    body = "\n".join(json.dumps(r, allow_nan=False) for r in rows).encode()
    opts = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")  # as from_pylist: row 0's keys
    table = pj.read_json(io.BytesIO(body), read_options=pj.ReadOptions(block_size=max(1 << 20, len(body) + 1)),
                         parse_options=opts)
    return table.select(schema.names).combine_chunks()
