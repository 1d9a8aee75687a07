"""Arrow side of the metadata: reading ``metadata.arrow`` files (memory-mapped, columnar)
and handing their column buffers to the native dataset by pointer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dataset_rt import _native
from dataset_rt._native import ffi, lib

KIND_BOOL, KIND_INT, KIND_FLOAT, KIND_STRING = 0, 1, 2, 3
KIND_NAMES = {KIND_BOOL: "bool", KIND_INT: "int", KIND_FLOAT: "float", KIND_STRING: "string"}


def arrow_type(kind: int) -> Any:
    """The Arrow type a cache stores for a metadata kind."""
    import pyarrow as pa

    return {KIND_BOOL: pa.bool_(), KIND_INT: pa.int64(), KIND_FLOAT: pa.float64(), KIND_STRING: pa.utf8()}[kind]


def schema_of(handle: Any) -> list[tuple[str, int]]:
    """The dataset's metadata schema as (name, kind) pairs, in manifest order."""
    count = ffi.new("uint64_t *")
    _native.check(lib.drt_dataset_field_count(handle, count))
    field = ffi.new("drt_field *")
    fields = []
    for i in range(count[0]):
        _native.check(lib.drt_dataset_field(handle, i, field))
        fields.append((ffi.buffer(field.name.ptr, field.name.len)[:].decode("utf-8"), int(field.kind)))
    return fields


def read_arrow_file(path: Path) -> Any:
    """The record batches of an Arrow IPC file, as one memory-mapped table."""
    import pyarrow as pa

    try:
        source = pa.memory_map(str(path), "r")
        reader = pa.ipc.open_file(source)
    except pa.ArrowInvalid as exc:
        if "footer" in str(exc).lower() or "magic" in str(exc).lower():
            raise ValueError("invalid metadata Arrow footer") from exc
        raise RuntimeError(f"Arrow error: {exc}") from exc
    except OSError as exc:
        raise RuntimeError(f"I/O error: {exc}") from exc
    try:
        return reader.read_all()
    except pa.ArrowException as exc:
        raise RuntimeError(f"Arrow error: {exc}") from exc


def read_cache_metadata(handle: Any, cache_index: int, cache_path: Path) -> list[Any]:
    """Validate cache ``cache_index``'s metadata.arrow against its manifest and attach its
    columns to the native dataset (for ``validate_cache`` comparisons and for resolving
    JSON nulls). Returns the buffers the native side borrows: keep them alive as long as
    the dataset."""
    import numpy as np

    fields = schema_of(handle)
    info = ffi.new("drt_cache_info *")
    _native.check(lib.drt_dataset_cache_info(handle, cache_index, info))
    table = read_arrow_file(cache_path / "metadata.arrow")
    if table.num_rows != info.sample_count:
        raise ValueError("metadata row count does not match manifest")
    if table.num_columns < len(fields):
        raise ValueError("metadata batch column count does not match manifest")
    keep: list[Any] = []
    columns = ffi.new("drt_column[]", max(1, len(fields)))
    rows = table.num_rows
    for i, (name, kind) in enumerate(fields):
        column = table.column(i)
        expected = arrow_type(kind)
        if column.type != expected:
            raise ValueError(f"metadata '{name}' is not {KIND_NAMES[kind]}")
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if array.null_count:
            raise ValueError(f"metadata '{name}' contains null")
        columns[i].kind = kind
        if kind == KIND_STRING:
            offsets = np.frombuffer(array.buffers()[1], dtype=np.int32, count=rows + 1, offset=array.offset * 4)
            offsets64 = offsets.astype(np.uint64)
            data = array.buffers()[2]
            keep += [offsets64, data]
            columns[i].values = ffi.cast("void *", data.address if data is not None else 0)
            columns[i].offsets = ffi.cast("uint64_t *", offsets64.ctypes.data)
        else:
            if kind == KIND_BOOL:
                values = np.ascontiguousarray(array.to_numpy(zero_copy_only=False), dtype=np.uint8)
            else:
                values = np.ascontiguousarray(array.to_numpy(zero_copy_only=False))
            keep.append(values)
            columns[i].values = ffi.cast("void *", values.ctypes.data)
    keep.append(table)
    _native.check(lib.drt_dataset_attach_metadata(handle, cache_index, rows, columns))
    return keep
