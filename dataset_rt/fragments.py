"""Build one cache from many independent tasks: write fragments anywhere, commit them once.

A *fragment* is the part of a cache that one task writes: an ordinary cache (records,
``index.bin``, ``metadata.arrow`` and a manifest with their checksums) written by the
native writer under ``<fragments_dir>/<fragment id>``. A *commit* turns an ordered list
of fragments into one published cache ``<base_dir>/<name>`` whose sample ids follow the
list. This is what :mod:`dataset_rt.integrations.ray` uses; Spark, Dask or SLURM jobs use
it directly (see ``docs/guide-ray.md``).

Contracts:

* **Retries.** A fragment id names one fragment: writing the same id again (a retried
  task) replaces the earlier attempt atomically (``renameat2(RENAME_EXCHANGE)``), so a
  commit never sees two copies and never a half-written one.
* **Order.** :func:`commit_fragments` assigns sample ids in the order of the list it is
  given: all samples of the first fragment in their order, then the second's, and so on.
* **Verification.** The commit (native) checks that every fragment has the first one's
  schema and compression, verifies the SHA-256 of every fragment file and that every
  index row lies inside its shard, then reuses the shard files unchanged (hard links, or
  copies across file systems). ``metadata.arrow`` is the fragments' files concatenated
  with pyarrow; the native commit checks its rows and types before publishing.
* **Atomicity.** Publication is the writer's: a staging directory under
  ``<base_dir>/tmp/``, fsyncs, the manifest last, an atomic rename that never replaces an
  existing cache unless ``replace=True``. A failed commit publishes nothing and removes
  its staging directory; fragments are never modified, so a commit can be retried.
* Fragments stay on disk after a commit (they share the shard files through hard links,
  so they cost no extra space until removed); remove them with :func:`remove_fragments`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from dataset_rt import _native
from dataset_rt._native import KIND_NAMES, Kind
from dataset_rt.config import WriterConfig
from dataset_rt.records import CacheWriteError, CacheWriteResult, CacheWriteSuccess
from dataset_rt.runtime import DatasetRuntime
from dataset_rt.writer import (
    SourceFailure,
    _Ingest,
    _Plan,
    _write_one,
    python_error,
    validate_writer_config,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "Fragment",
    "FragmentWriteError",
    "commit_fragments",
    "fragment_name",
    "remove_fragments",
    "write_fragment",
    "write_fragment_arrow",
]

DEFAULT_WRITER_CONFIG = WriterConfig(show_progress=False)


class Fragment(NamedTuple):
    """A written fragment: its id, its directory and its number of samples."""

    fragment_id: str
    path: Path
    sample_count: int


class FragmentWriteError(RuntimeError):
    """Writing a fragment failed; ``args`` are ``(fragment_id, message)`` as in
    :class:`~dataset_rt.CacheWriteError`. Nothing of the attempt is left on disk (an
    earlier successful attempt of the same id is kept)."""

    @property
    def fragment_id(self) -> str:
        return str(self.args[0])

    @property
    def message(self) -> str:
        return str(self.args[1])

    def __str__(self) -> str:
        return f"fragment {self.args[0]}: {self.args[1]}"


def fragment_name(fragment_id: int | str) -> str:
    """The directory name of a fragment id: a non-negative int becomes 9 zero-padded
    digits (so names sort like the ids below 10^9; a larger id has more digits and sorts
    before the 9-digit names that start with a greater digit: pass the commit its
    fragments in order rather than sorting names); a str must be a plain path segment
    (not empty, no ``/``, not ``.``, ``..`` or ``tmp``) and is used as is. Raises
    ValueError."""
    if isinstance(fragment_id, bool) or not isinstance(fragment_id, (int, str)):
        raise ValueError(f"fragment id must be an int or a str, not {type(fragment_id).__name__}")
    if isinstance(fragment_id, int):
        if fragment_id < 0:
            raise ValueError("fragment id must not be negative")
        return f"{fragment_id:09d}"
    if fragment_id in ("", ".", "..", "tmp") or any(c in fragment_id for c in "/\\\x00"):
        raise ValueError(f"fragment id must be a plain path segment: {fragment_id!r}")
    return fragment_id


def write_fragment(
    runtime: DatasetRuntime,
    samples: Iterable[Any],
    fragments_dir: str | os.PathLike[str],
    fragment_id: int | str,
    *,
    writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
) -> Fragment:
    """Write ``samples`` (``CacheInput``-like ``(data, metadata)`` pairs, exactly what a
    source of ``write_cache`` yields, with the same checks and errors) as the fragment
    ``<fragments_dir>/<fragment_name(fragment_id)>``.

    Uses ``writer_config``'s ``max_shard_bytes``, ``prefetch_size`` and
    ``shard_compression`` (all fragments of one cache need the same compression);
    ``num_processes`` and the profiler are ignored. An existing fragment of the same id
    is replaced atomically. Raises :class:`FragmentWriteError` when the samples or the
    disk fail (nothing of this attempt is left), ValueError for a bad id or config.
    """
    return _write(runtime, fragments_dir, fragment_id, writer_config, source=samples, feed=None)


def write_fragment_arrow(
    runtime: DatasetRuntime,
    tables: Iterable[pa.Table | pa.RecordBatch],
    fragments_dir: str | os.PathLike[str],
    fragment_id: int | str,
    *,
    data_column: str = "data",
    writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
) -> Fragment:
    """Write Arrow tables (or record batches), row by row in order, as one fragment,
    without creating a Python object per row.

    ``data_column`` (binary or large_binary) holds the payloads; every other column is
    metadata: booleans, integers (within int64), floats and strings (utf8 or
    large_utf8), without nulls. Every table must have the same metadata columns with the
    same kinds. Otherwise as :func:`write_fragment`.
    """

    def feed(ingest: _Ingest) -> None:
        columns = _ArrowColumns(data_column)
        for table in tables:
            columns.append(ingest, table)
        ingest.complete()

    return _write(runtime, fragments_dir, fragment_id, writer_config, source=None, feed=feed)


def _write(
    runtime: DatasetRuntime,
    fragments_dir: str | os.PathLike[str],
    fragment_id: int | str,
    writer_config: WriterConfig,
    *,
    source: Any,
    feed: Any,
) -> Fragment:
    name = fragment_name(fragment_id)
    options = validate_writer_config(writer_config)
    base = Path(fragments_dir)
    plan = _Plan(0, source, name, None, replace=True)
    result = _write_one(runtime._runtime, plan, base, options, None, None, feed)
    if isinstance(result, CacheWriteError):
        raise FragmentWriteError(name, result.message)
    manifest = json.loads((base / name / "manifest.json").read_text(encoding="utf-8"))
    return Fragment(name, base / name, int(manifest["sample_count"]))


_ARROW_KINDS = {
    "bool": Kind.BOOL,
    "int8": Kind.INT,
    "int16": Kind.INT,
    "int32": Kind.INT,
    "int64": Kind.INT,
    "uint8": Kind.INT,
    "uint16": Kind.INT,
    "uint32": Kind.INT,
    "uint64": Kind.INT,
    "halffloat": Kind.FLOAT,
    "float": Kind.FLOAT,
    "double": Kind.FLOAT,
    "string": Kind.STRING,
    "large_string": Kind.STRING,
}


class _ArrowColumns:
    """Turns Arrow tables into the writer's columnar batches (buffers, no per-row objects)."""

    def __init__(self, data_column: str) -> None:
        self.data_column = data_column
        self.keys: list[str] | None = None
        self.kinds: list[Kind] = []

    def append(self, ingest: _Ingest, table: Any) -> None:
        import numpy as np
        import pyarrow as pa

        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if table.num_rows == 0:
            return
        names = table.column_names
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise SourceFailure(f"a fragment table names columns more than once: {twice}")
        if self.data_column not in names:
            raise SourceFailure(f"no payload column '{self.data_column}' (columns: {names})")
        keys = sorted(
            (n for n in names if n != self.data_column),
            key=lambda k: k.encode("utf-8", "surrogatepass"),
        )
        kinds = []
        for key in keys:
            arrow_type = table.schema.field(key).type
            kind = _ARROW_KINDS.get(str(arrow_type))
            if kind is None:
                raise SourceFailure(
                    f"metadata column '{key}' has type {arrow_type}; "
                    "metadata values must be bool, int, float, or str"
                )
            kinds.append(kind)
        if self.keys is None:
            if not keys:
                raise SourceFailure(
                    f"a fragment table needs at least one metadata column besides "
                    f"'{self.data_column}'; write samples without metadata with "
                    "DatasetRuntime.write_cache"
                )
            ingest.set_schema(keys, kinds)
            self.keys, self.kinds = keys, kinds
        elif keys != self.keys:
            raise SourceFailure("metadata keys must be identical for every sample")
        elif kinds != self.kinds:
            key, kind, got = next(c for c in zip(keys, self.kinds, kinds) if c[1] != c[2])
            raise SourceFailure(
                f"metadata field '{key}' expected {KIND_NAMES[kind]}, got {KIND_NAMES[got]}"
            )

        data = table.column(self.data_column).combine_chunks()
        if not (pa.types.is_binary(data.type) or pa.types.is_large_binary(data.type)):
            raise SourceFailure(f"payload column '{self.data_column}' must be binary")
        if data.null_count:
            raise SourceFailure("data must be bytes-like")
        blob, offsets = _bytes_and_offsets(data.cast(pa.large_binary()))
        values: list[tuple[Any, Any]] = []
        for key, kind in zip(keys, kinds):
            column = table.column(key).combine_chunks()
            if column.null_count:
                raise SourceFailure(f"metadata column '{key}' has nulls")
            if kind == Kind.STRING:
                text, text_offsets = _bytes_and_offsets(column.cast(pa.large_string()))
                first = int(text_offsets[0])
                values.append((text[first : int(text_offsets[-1])], text_offsets - first))
            elif kind == Kind.INT:
                if pa.types.is_uint64(column.type) and len(column):
                    import pyarrow.compute as pc

                    biggest = pc.max(column).as_py()
                    if biggest is not None and biggest > 2**63 - 1:
                        raise SourceFailure(f"metadata field '{key}' is outside the int64 range")
                array = column.cast(pa.int64()).to_numpy(zero_copy_only=False)
                values.append((np.ascontiguousarray(array, dtype=np.int64), None))
            elif kind == Kind.FLOAT:
                array = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
                values.append((np.ascontiguousarray(array, dtype=np.float64), None))
            else:
                array = column.to_numpy(zero_copy_only=False)
                values.append((np.ascontiguousarray(array, dtype=np.uint8), None))
        ingest.append_columns(table.num_rows, blob, offsets, values)


def _bytes_and_offsets(array: Any) -> tuple[Any, Any]:
    """The value buffer (as a memoryview) and uint64 offsets of a large_binary/large_string
    array, honouring the array's slice offset."""
    import numpy as np

    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[
        array.offset : array.offset + len(array) + 1
    ].astype(np.uint64)
    data = memoryview(data_buffer) if data_buffer is not None else memoryview(b"")
    return data, offsets


def commit_fragments(
    fragments: Sequence[Fragment | str | os.PathLike[str]],
    base_dir: str | os.PathLike[str],
    name: str,
    *,
    replace: bool = False,
) -> CacheWriteResult:
    """Commit ``fragments`` (in this order: it decides the sample ids) into the cache
    ``<base_dir>/<name>``.

    Returns ``CacheWriteSuccess(name, base_dir / name)`` or ``CacheWriteError(name,
    message)`` like ``write_cache``: e.g. ``"cache path already exists: ..."`` (unless
    ``replace``, which swaps an existing cache out atomically), ``"checksum mismatch for
    <file>"``, ``"missing fragment manifest: <path>/manifest.json"``. On error nothing is
    published and no staging directory is left; the fragments are never modified.
    """
    import pyarrow as pa

    paths = [Path(f.path) if isinstance(f, Fragment) else Path(f) for f in fragments]
    flags = _native.CommitFlag.REPLACE if replace else _native.CommitFlag(0)
    try:
        # Native failures of the commit are returned as its CacheWriteError.
        commit = _native.Commit.open(base_dir, name, paths, flags, error=SourceFailure)
    except SourceFailure as failure:
        return CacheWriteError(name, str(failure))
    with commit:
        directory = commit.staging_path()
        try:
            _merge_metadata(paths, os.path.join(directory, "metadata.arrow"))
        except (pa.ArrowException, OSError) as exc:
            return CacheWriteError(name, python_error(exc))
        try:
            commit.finish()
        except SourceFailure as failure:
            return CacheWriteError(name, str(failure))
    return CacheWriteSuccess(name, Path(base_dir) / name)


def _merge_metadata(paths: list[Path], target: str) -> None:
    """Concatenate the fragments' metadata.arrow (verified by the native open) into one
    IPC file with one record batch and non-null fields, as the writer writes it."""
    import pyarrow as pa

    tables = []
    for path in paths:
        with pa.memory_map(str(path / "metadata.arrow")) as source:
            tables.append(pa.ipc.open_file(source).read_all())
    table = pa.concat_tables(tables).combine_chunks()
    schema = pa.schema([pa.field(f.name, f.type, nullable=False) for f in table.schema])
    arrays = [
        column.chunk(0) if column.num_chunks else pa.array([], column.type)
        for column in table.columns
    ]
    if arrays:
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    else:  # samples without metadata: no column, but the batch still has a row per sample
        # (concat_tables of tables without columns drops their rows: count them here)
        count = sum(t.num_rows for t in tables)
        rows = pa.StructArray.from_buffers(pa.struct([]), count, [None])
        batch = pa.RecordBatch.from_struct_array(rows)
    with pa.OSFile(target, "wb") as sink, pa.ipc.new_file(sink, schema) as ipc:
        ipc.write_batch(batch)


def remove_fragments(fragments_dir: str | os.PathLike[str]) -> None:
    """Remove a fragments directory and everything in it (no error when it is gone).
    Published caches are unaffected: they hold their own links to the shard files."""
    try:
        shutil.rmtree(fragments_dir)
    except FileNotFoundError:
        pass
