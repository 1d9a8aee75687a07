"""Arrow side of the metadata: reading ``metadata.arrow`` files (memory-mapped, columnar),
building the initial active table, and checking a new one before its identity and weight
columns go to the native dataset (by pointer, through ``_native.Dataset.set_table``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dataset_rt._native import Kind, replaced_error


def arrow_type(kind: int) -> Any:
    """The Arrow type a cache stores for a metadata kind."""
    import pyarrow as pa

    return {
        Kind.BOOL: pa.bool_(),
        Kind.INT: pa.int64(),
        Kind.FLOAT: pa.float64(),
        Kind.STRING: pa.utf8(),
    }[kind]


def read_arrow_file(path: Path) -> Any:
    """The record batches of an Arrow IPC file, as one memory-mapped table, fully
    validated (offsets, UTF-8): a damaged file must raise here, not crash whatever
    consumes the columns later (Polars trusts Arrow data)."""
    import stat

    import pyarrow as pa

    # Only a regular file: mapping a FIFO would block, a device never ends.
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise RuntimeError(f"I/O error: {exc.strerror} (os error {exc.errno}): {path}") from exc
    if not stat.S_ISREG(mode):
        raise ValueError(f"not a regular file: {path}")
    try:
        source = pa.memory_map(os.fsencode(path), "r")  # any bytes, not only UTF-8
    except OSError as exc:
        raise RuntimeError(f"I/O error: {exc.strerror} (os error {exc.errno}): {path}") from exc
    # The footer is located as the reference's get_metadata locates it: not an IPC file
    # at all (no leading magic, even when the end of the file looks right: pyarrow reads
    # only the end), a footer length pointing outside the file, or a footer that fails
    # verification is its ValueError "invalid metadata Arrow footer"; a missing trailing
    # magic (truncation) or a negative length an Arrow parser error. (Its validated open
    # reads the file with arrow-rs and reports all but the first as Arrow parser errors,
    # as the native parser, arrow.zig, does.)
    size = source.size()
    if size < 6 or source.read_at(6, 0) != b"ARROW1":
        raise ValueError(f"invalid metadata Arrow footer: {path}")
    if size < 18 or source.read_at(6, size - 6) != b"ARROW1":
        raise RuntimeError(
            f"Arrow error: Parser error: Arrow file does not contain correct footer: {path}"
        )
    footer_length = int.from_bytes(source.read_at(4, size - 10), "little", signed=True)
    if footer_length < 0:
        raise RuntimeError(
            f"Arrow error: Parser error: Invalid footer length: {footer_length}: {path}"
        )
    if footer_length == 0 or footer_length > size - 18:
        raise ValueError(f"invalid metadata Arrow footer: {path}")
    try:
        reader = pa.ipc.open_file(source)
        reader.schema.names  # noqa: B018 - decodes field names (invalid UTF-8 raises here)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"invalid metadata Arrow footer: {exc}: {path}") from exc
    try:
        table = reader.read_all()
        table.validate(full=True)
        table.schema.names  # noqa: B018 - the batches' own field names too
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise RuntimeError(f"Arrow error: {exc}: {path}") from exc
    return table


# ------------------------------------------------------------------------ active table

STORED_ARROW_NAMES = {
    Kind.BOOL: "Boolean",
    Kind.INT: "Int64",
    Kind.FLOAT: "Float64",
    Kind.STRING: "Utf8",
}
ID_COLUMNS = ("cache_id", "sample_id", "weight")


def _arrow_kind_matches(kind: int, actual: Any) -> bool:
    """Whether a column of Arrow type ``actual`` may hold a stored column of ``kind``.

    Strings accept utf8, large_utf8 and string views (what Polars produces)."""
    import pyarrow as pa

    if kind == Kind.STRING:
        return actual in (pa.utf8(), pa.large_utf8()) or str(actual) == "string_view"
    return actual == arrow_type(kind)


def _check_same_directory(dataset: Any, index: int, path: Path) -> None:
    """Raise the library's "was replaced" error unless ``path``, cache ``index``'s
    directory, still names the directory the dataset opened (a rebuild swaps in a new
    one): its metadata.arrow, opened by path just before, is then that cache's own, never
    a rebuilt cache's."""
    identity = dataset._dir_identities[index]
    if identity is None:  # a URL: its local copy is addressed by content
        return
    try:
        st = os.stat(path)
        same = (st.st_dev, st.st_ino) == identity
    except OSError:
        same = False
    if not same:
        raise replaced_error(path)


def default_table(dataset: Any) -> Any:
    """The initial active table: cache_id, sample_id, stored columns, weight (all 1.0).

    Built from the memory-mapped metadata.arrow of every cache, columnar (no Python row
    objects).
    """
    import numpy as np
    import polars as pl
    import pyarrow as pa

    handle = dataset._handle
    fields = handle.fields()
    counts: list[int] = []
    ids: list[int] = []
    chunks: list[list[Any]] = [[] for _ in fields]
    for index in range(len(dataset.cache_paths)):
        info = handle.cache_info(index)
        counts.append(info.sample_count)
        ids.append(info.cache_id)
        # The cache's own directory, or the verified local copy of a remote cache's files.
        directory = Path(os.fsdecode(handle.cache_dir(index)))
        try:
            table = read_arrow_file(directory / "metadata.arrow")
        finally:  # (also when a replaced cache's new file does not read)
            _check_same_directory(dataset, index, directory)
        if table.num_columns != len(fields):
            raise ValueError("metadata batch column count does not match manifest")
        for i, (name, kind) in enumerate(fields):
            field = table.schema.field(i)
            if field.name != name or field.type != arrow_type(kind):
                raise ValueError(f"metadata column '{name}' does not match manifest schema")
        if table.num_rows != info.sample_count:
            raise ValueError(
                f"metadata row count for cache {index} expected {info.sample_count}, "
                f"got {table.num_rows}"
            )
        for name, column in zip(table.column_names, table.columns):
            if column.null_count:  # the library's load rejects it too (as 0.4.8 does)
                raise RuntimeError(
                    "Arrow error: Invalid argument error: Column "
                    f"'{name}' is declared as non-nullable but contains null values: "
                    f"{directory / 'metadata.arrow'}"
                )
        for i in range(len(fields)):
            chunks[i].extend(table.column(i).chunks)
    count_array = np.array(counts, dtype=np.int64)
    columns: dict[str, Any] = {
        "cache_id": pa.array(
            np.repeat(np.array(ids, dtype=np.uint64), count_array), type=pa.uint64()
        ),
        "sample_id": pa.array(
            np.concatenate([np.arange(c, dtype=np.uint64) for c in counts]), type=pa.uint64()
        ),
    }
    for (name, kind), parts in zip(fields, chunks):
        columns[name] = pa.chunked_array(parts, type=arrow_type(kind))
    columns["weight"] = pa.array(np.ones(int(count_array.sum()), dtype=np.float64))
    # Arrow field names may repeat (a stored key named like an identity column); let
    # Polars report it as the reference does (DuplicateError).
    return pl.from_arrow(pa.table(list(columns.values()), names=list(columns)), rechunk=False)


def _arrow_array(series: Any) -> Any:
    """One Polars Series or Arrow column as a single pyarrow Array (zero-copy where Arrow
    allows)."""
    import pyarrow as pa

    array = series if isinstance(series, (pa.Array, pa.ChunkedArray)) else series.rechunk()
    if not isinstance(array, (pa.Array, pa.ChunkedArray)):
        array = array.to_arrow()
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return array


def _set_table(dataset: Any, rows: int, column: Any) -> None:
    """Hand the id and weight columns (``column(name)``: Polars or Arrow) to the native
    dataset, which validates them and replaces the active table."""
    cache_ids = _arrow_array(column("cache_id"))
    sample_ids = _arrow_array(column("sample_id"))
    weights = _arrow_array(column("weight"))
    dataset._handle.set_table(rows, cache_ids, sample_ids, weights)


def validate_and_set(dataset: Any, df: Any) -> None:
    """Validate ``df`` as the new active table and install it natively (see
    ``CachedDataset.update_metadata``). Raises ValueError; the previous state is kept."""
    df.to_arrow  # noqa: B018 - a non-DataFrame fails here, with the reference's AttributeError
    # The schema of an empty slice: converting the whole frame would copy every column
    # (strings included) only to read types.
    empty = df.head(0).to_arrow()
    empty.__arrow_c_stream__  # noqa: B018 - a Series fails here, with the reference's AttributeError
    _check_schema(dataset, df.height, empty.schema, df.columns)
    _set_table(dataset, df.height, df.get_column)


def _check_schema(dataset: Any, rows: int, schema: Any, names: Any) -> None:
    """``update_metadata``'s checks before the native ones, in the reference's order: a
    row, the stored columns (present, Arrow type), the id and weight columns present."""
    if rows == 0:
        raise ValueError("metadata table must include at least one sample")
    for name, kind in dataset._handle.fields():
        index = schema.get_field_index(name)
        if index < 0:
            raise ValueError(f"samples metadata missing '{name}' column")
        if not _arrow_kind_matches(kind, schema.field(index).type):
            raise ValueError(
                f"samples metadata column '{name}' must have Arrow type {STORED_ARROW_NAMES[kind]}"
            )
    for name in ID_COLUMNS:
        if name not in names:
            raise ValueError(f"samples metadata missing '{name}' column")


def set_arrow_table(dataset: Any, table: Any) -> None:
    """``validate_and_set`` for a pyarrow table (a snapshot's ``metadata.arrow``), without
    Polars: the same checks and messages. Safe in a forked child, where Polars' thread
    pool hangs."""
    _check_schema(dataset, table.num_rows, table.schema, table.column_names)
    _set_table(dataset, table.num_rows, table.column)
