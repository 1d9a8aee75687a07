"""`CachedDataset`: caches loaded together, read in a deterministic order.

The native dataset owns every piece of state that decides what is read: the caches, the
active table, the stream position (ordered cursor or draw counter) and the epoch length.
Python adapts types: it turns native batches (one payload arena plus typed metadata
columns) into ``CachedSample`` tuples, a batch at a time.
"""

from __future__ import annotations

import operator
import os
import threading
from collections.abc import Iterator
from itertools import pairwise, repeat
from pathlib import Path
from typing import Any, NamedTuple

from dataset_rt import _native
from dataset_rt._native import ffi, lib
from dataset_rt.config import ReaderConfig
from dataset_rt.metadata import schema_of
from dataset_rt.records import CachedSample

KIND_BOOL, KIND_INT, KIND_FLOAT, KIND_STRING = 0, 1, 2, 3
IO_BACKENDS = {"auto": 0, "io_uring": 1, "threads": 2}
IO_BACKEND_NAMES = {1: "io_uring", 2: "threads"}
IO_BACKEND_ENV = "DATASET_RT_IO_BACKEND"

# Samples requested per native call; the native side caps a batch at prefetch_size.
BATCH_SAMPLES_MAX = 4096

_new_sample = tuple.__new__


def _close_dataset(handle: Any, close: Any = lib.drt_dataset_close) -> None:
    close(handle)


def _close_lookup(handle: Any, close: Any = lib.drt_lookup_close) -> None:
    close(handle)


def _native_options(reader_config: Any) -> Any:
    """drt_dataset_options for a (possibly duck-typed) ReaderConfig."""
    seed = int(reader_config.seed)
    prefetch_size = int(reader_config.prefetch_size)
    if seed < 0 or prefetch_size < 0:
        raise OverflowError("can't convert negative int to unsigned")
    if seed >= 2**64 or prefetch_size >= 2**64:
        raise OverflowError("int too big to convert")
    if prefetch_size == 0:
        raise ValueError("prefetch_size must be greater than zero")
    backend = getattr(reader_config, "io_backend", "auto")
    if backend == "auto":
        backend = os.environ.get(IO_BACKEND_ENV, "auto") or "auto"
    if backend not in IO_BACKENDS:
        raise ValueError(
            f"unknown io_backend {backend!r}; expected 'auto', 'io_uring' or 'threads'"
        )
    return ffi.new(
        "drt_dataset_options *",
        {
            "seed": seed,
            "prefetch_size": prefetch_size,
            "shuffle": 1 if reader_config.shuffle else 0,
            "validate_cache": 1 if reader_config.validate_cache else 0,
            "io_backend": IO_BACKENDS[backend],
            "sampling": 1
            if getattr(reader_config, "sampling", "with_replacement") == "permutation"
            else 0,
        },
    )


def _open_native(runtime: Any, paths: list[Path], options: Any) -> Any:
    encoded = [_native.encode_path(p) for p in paths]
    strs = ffi.new("drt_str[]", max(1, len(encoded)))
    for item, raw in zip(strs, encoded):
        item.ptr = ffi.from_buffer(raw)
        item.len = len(raw)
    out = ffi.new("drt_dataset **")
    _native.check(lib.drt_dataset_open(runtime._handle(), strs, len(encoded), options, out))
    return ffi.gc(out[0], _close_dataset)


def probe_cache(runtime: Any, path: Path, *, validate: bool) -> tuple[str | None, str | None]:
    """``(None, fingerprint)`` when ``path`` opens as a complete cache (checksums verified
    when ``validate``; fingerprint None when it has none), else ``(error message, None)``."""
    options = ffi.new(
        "drt_dataset_options *", {"seed": 0, "prefetch_size": 1, "validate_cache": int(validate)}
    )
    try:
        handle = _open_native(runtime, [path], options)
    except (ValueError, RuntimeError, OverflowError) as exc:
        return str(exc), None
    info = ffi.new("drt_cache_info *")
    _native.check(lib.drt_dataset_cache_info(handle, 0, info))
    fingerprint = None
    if info.fingerprint.ptr != ffi.NULL:
        fingerprint = ffi.buffer(info.fingerprint.ptr, info.fingerprint.len)[:].decode("utf-8")
    ffi.release(handle)
    return None, fingerprint


class CachedDataset:
    """Caches loaded as one dataset, in ``cache_paths`` order.

    Not constructed directly: use ``DatasetRuntime.cached_dataset`` or
    ``DatasetRuntime.from_cache_sources``. Iterating yields ``CachedSample`` records; each
    iterator takes the next ``len(dataset)`` positions of the dataset's stream when its
    first sample is requested.
    """

    cache_paths: list[Path]
    reader_config: ReaderConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("use DatasetRuntime.cached_dataset() to create a CachedDataset")

    @classmethod
    def _open(cls, runtime: Any, paths: list[Path], reader_config: ReaderConfig) -> CachedDataset:
        options = _native_options(reader_config)
        if not paths:
            raise ValueError("CachedDataset requires at least one cache path")
        handle = _open_native(runtime, paths, options)
        self = object.__new__(cls)
        self.cache_paths = list(paths)
        self.reader_config = reader_config
        self._runtime = runtime
        self._handle = handle
        self._lookup: Any = None
        self._lookup_lock = threading.Lock()
        self._columns = schema_of(handle)
        self._field_names = [name for name, _ in self._columns]
        self._make_dicts = _dict_builder(self._field_names)
        self._state_lock = threading.RLock()
        self._active: Any = None
        return self

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle 'CachedDataset' object")

    def __len__(self) -> int:
        out = ffi.new("uint64_t *")
        _native.check(lib.drt_dataset_epoch_len(self._handle, out))
        if out[0] > 2**63 - 1:
            raise OverflowError()
        return int(out[0])

    def set_epoch_len(self, epoch_len: int) -> None:
        """Set the number of samples each future iterator yields (>= 1).

        Does not move the stream position; iterators already started keep theirs.
        """
        if epoch_len < 1:
            raise ValueError("epoch_len must be at least 1")
        value = epoch_len.__index__()
        if value >= 2**64:
            raise OverflowError("int too big to convert")
        _native.check(lib.drt_dataset_set_epoch_len(self._handle, value))

    @property
    def io_backend(self) -> str:
        """The read I/O backend in use: ``"io_uring"`` or ``"threads"``."""
        out = ffi.new("int32_t *")
        _native.check(lib.drt_dataset_io_backend(self._handle, out))
        return IO_BACKEND_NAMES[out[0]]

    @property
    def io_stats(self) -> dict[str, int]:
        """Read counters since the dataset was opened: ``uring_reads``, ``pool_reads``
        (prefetch reads by backend), ``lookup_reads`` (``get_item``) and ``bytes_read``."""
        out = ffi.new("drt_io_stats *")
        _native.check(lib.drt_dataset_io_stats(self._handle, out))
        return {
            name: int(getattr(out, name))
            for name in ("uring_reads", "pool_reads", "lookup_reads", "bytes_read")
        }

    def __iter__(self) -> Iterator[CachedSample]:
        return self._generate()

    def _generate(self) -> Iterator[CachedSample]:
        # A generator: nothing native happens (no window is reserved) until the first next().
        out = ffi.new("drt_iter **")
        _native.check(lib.drt_iter_open(self._handle, out))
        iterator = out[0]
        batch = ffi.new("drt_batch *")
        try:
            while True:
                _native.check(lib.drt_iter_next_batch(iterator, BATCH_SAMPLES_MAX, 0, batch))
                if batch.count == 0:
                    return
                yield from self._samples(batch)
        finally:
            lib.drt_iter_close(iterator)

    def _samples(self, batch: Any) -> list[CachedSample]:
        """Python records for one native batch (copies everything out of it).

        Per-batch work is a handful of C-level ``ffi.unpack`` calls (no numpy: batches
        are small, and its per-call overhead would dominate); per-sample work is one
        payload slice, one dict and one tuple.
        """
        n = int(batch.count)
        payloads = _payloads(batch, n)
        cache_ids = ffi.unpack(batch.cache_ids, n)
        sample_ids = ffi.unpack(batch.sample_ids, n)
        columns = [
            _column_values(batch.columns[i], kind, n) for i, (_, kind) in enumerate(self._columns)
        ]
        metadata = self._make_dicts(n, *columns)
        return list(
            map(_new_sample, repeat(CachedSample), zip(payloads, metadata, cache_ids, sample_ids))
        )

    def iter_batches(self, batch_size: int, *, copy: bool = True) -> Iterator[SampleBatch]:
        """Iterate the same stream as ``iter(dataset)``, a batch of samples at a time.

        Takes one window (``len(dataset)`` samples) like a per-sample iterator, on the first
        ``next()``. Each :class:`SampleBatch` holds up to ``batch_size`` samples (the last one
        may be shorter): the payloads as one contiguous ``numpy.uint8`` array with
        ``len + 1`` offsets, the identities as ``numpy.uint64`` arrays, and the embedded
        metadata as a Polars frame.

        Lifetime: with ``copy=True`` (the default) the arrays own their memory and stay
        valid as long as the caller keeps them. With ``copy=False``, ``data``,
        ``cache_id`` and ``sample_id`` are zero-copy views of the native batch buffer,
        valid only until the next batch is requested or the iterator is closed; reading
        them later returns other samples' bytes. Use it when each batch is consumed (or
        copied, e.g. into a pinned tensor) before the next one.
        """
        size = operator.index(batch_size)
        if size < 1:
            raise ValueError("batch_size must be at least 1")
        return self._generate_batches(size, bool(copy))

    def _generate_batches(self, size: int, copy: bool) -> Iterator[SampleBatch]:
        out = ffi.new("drt_iter **")
        _native.check(lib.drt_iter_open(self._handle, out))
        iterator = out[0]
        batch = ffi.new("drt_batch *")
        try:
            while True:
                _native.check(
                    lib.drt_iter_next_batch(iterator, size, lib.DRT_BATCH_CONTIGUOUS, batch)
                )
                if batch.count == 0:
                    return
                yield _sample_batch(batch, self._columns, copy)
        finally:
            lib.drt_iter_close(iterator)

    def get_item(self, cache_id: int, sample_id: int) -> CachedSample:
        """The stored sample ``(cache_id, sample_id)`` with its embedded metadata.

        Random access: works for rows outside the active table and moves no cursor.
        """
        if type(cache_id) is not int or type(sample_id) is not int:
            raise TypeError("cache_id and sample_id must be integers")
        if not 0 <= cache_id < 2**64:
            raise IndexError(f"cache_id {cache_id} is out of range")
        if not 0 <= sample_id < 2**64:
            raise IndexError(f"sample_id {sample_id} is out of range")
        with self._lookup_lock:
            if self._lookup is None:
                out = ffi.new("drt_lookup **")
                _native.check(lib.drt_lookup_open(self._handle, out))
                # One lookup handle and call buffers per dataset, reused by every call.
                self._lookup = (
                    ffi.gc(out[0], _close_lookup),
                    ffi.new("uint64_t[2]"),
                    ffi.new("drt_batch *"),
                )
            handle, ids, batch = self._lookup
            ids[0] = cache_id
            ids[1] = sample_id
            status = lib.drt_lookup_get(handle, 1, ids, ids + 1, 0, batch)
            if status:
                _native.raise_status(status)
            data = ffi.buffer(batch.payloads[0], batch.payload_lens[0])[:]
            columns = batch.columns
            values = [
                _column_values(columns[i], kind, 1)[0] for i, (_, kind) in enumerate(self._columns)
            ]
            return _new_sample(
                CachedSample, (data, dict(zip(self._field_names, values)), cache_id, sample_id)
            )

    def get_metadata(self) -> Any:
        """The active metadata table as a Polars DataFrame.

        Before any update: ``cache_id`` (UInt64), ``sample_id`` (UInt64), the stored
        columns in manifest order, ``weight`` (Float64, all 1.0), one row per physical
        sample in path order, built from the memory-mapped ``metadata.arrow`` files. After
        ``update_metadata(df)``: exactly ``df``. Never touches the cache files.
        """
        with self._state_lock:
            if self._active is None:
                from dataset_rt.metadata import default_table

                _native.check_owner(self._runtime._pid)  # Polars would hang in a fork

                self._active = default_table(self)
            return self._active

    def samples_metadata(self) -> Any:
        """Alias of :meth:`get_metadata`."""
        return self.get_metadata()

    def update_metadata(self, df: Any) -> None:
        """Replace the active table that future iterators sample from.

        ``df`` (a Polars DataFrame) needs the stored metadata columns with their Arrow
        types, and ``cache_id``, ``sample_id`` (integers naming existing samples) and
        ``weight`` (positive, finite) columns; rows may be filtered, reordered or
        duplicated and extra columns are kept. The whole table is validated natively
        first; on any error (``ValueError``) nothing changes. On success the cursor and
        draw stream restart at 0, shuffled reading switches to weighted draws, and the
        epoch length becomes the row count. Cache files are never rewritten.
        """
        from dataset_rt.metadata import validate_and_set

        _native.check_owner(self._runtime._pid)
        with self._state_lock:
            validate_and_set(self, df)
            self._active = df

    def set_samples_metadata(self, df: Any) -> None:
        """Alias of :meth:`update_metadata`."""
        self.update_metadata(df)

    def update_manifests(self, version: int) -> Any:
        """Rewrite format-2 manifests of this dataset's caches as format 3 (atomically).

        Returns ``Ok(ManifestUpdateReport)`` or ``Err(ManifestUpdateError)``; see the
        storage-format docs. Sample files, the active table and cursors are unchanged.
        """
        from dataset_rt.manifests import update_manifests

        _native.check_owner(self._runtime._pid)
        return update_manifests(self, version)

    def dump_config(self, path: str | os.PathLike[str]) -> Path:
        """Write ``dataset.json`` and the active table (``metadata.arrow``) into the
        existing directory ``path``; returns the ``dataset.json`` path."""
        from dataset_rt.snapshot import dump_config

        _native.check_owner(self._runtime._pid)
        return dump_config(self, path)

    @classmethod
    def from_config(cls, path: str | os.PathLike[str]) -> CachedDataset:
        """Rebuild a dataset (new runtime, same caches, active table and epoch length)
        from a ``dataset.json`` written by :meth:`dump_config`. The stream starts at 0."""
        from dataset_rt.snapshot import load_config

        return load_config(path)

    def to_torch_iterable_dataset(self) -> Any:
        """A ``torch.utils.data.IterableDataset`` over this dataset's stream."""
        raise NotImplementedError("to_torch_iterable_dataset arrives with issue #6")

    def to_torch_dataloader(self, **kwargs: Any) -> Any:
        """A ``torch.utils.data.DataLoader`` reading from snapshots of this dataset."""
        raise NotImplementedError("to_torch_dataloader arrives with issue #6")


class SampleBatch(NamedTuple):
    """A batch from :meth:`CachedDataset.iter_batches`.

    Sample ``i``'s payload is ``data[offsets[i]:offsets[i + 1]]``; its identity is
    ``(cache_id[i], sample_id[i])`` and its embedded metadata is row ``i`` of ``metadata``.
    """

    data: Any
    offsets: Any
    cache_id: Any
    sample_id: Any
    metadata: Any

    def __len__(self) -> int:  # type: ignore[override]
        return len(self.cache_id)

    def payload(self, i: int) -> bytes:
        """Sample ``i``'s payload as bytes."""
        return self.data[self.offsets[i] : self.offsets[i + 1]].tobytes()


def _sample_batch(batch: Any, columns: list[tuple[str, int]], copy: bool) -> SampleBatch:
    """One contiguous native batch as numpy arrays (copied, or views when ``copy`` is
    false) and a Polars frame (always its own memory)."""
    import numpy as np
    import polars as pl

    n = int(batch.count)
    lens = np.frombuffer(ffi.buffer(batch.payload_lens, 8 * n), dtype=np.uint64)
    offsets = np.zeros(n + 1, dtype=np.uint64)
    np.cumsum(lens, out=offsets[1:])
    data = np.frombuffer(ffi.buffer(batch.payload_base, int(offsets[-1])), dtype=np.uint8)
    cache_id = np.frombuffer(ffi.buffer(batch.cache_ids, 8 * n), dtype=np.uint64)
    sample_id = np.frombuffer(ffi.buffer(batch.sample_ids, 8 * n), dtype=np.uint64)
    if copy:
        data, cache_id, sample_id = data.copy(), cache_id.copy(), sample_id.copy()
    frame = pl.DataFrame(
        {name: _column_array(batch.columns[i], kind, n) for i, (name, kind) in enumerate(columns)}
    )
    return SampleBatch(data, offsets, cache_id, sample_id, frame)


def _column_array(column: Any, kind: int, n: int) -> Any:
    """A metadata column of a native batch as a numpy or pyarrow array (copied)."""
    import numpy as np
    import pyarrow as pa

    if kind == KIND_INT:
        return np.frombuffer(ffi.buffer(column.values, 8 * n), dtype=np.int64).copy()
    if kind == KIND_FLOAT:
        return np.frombuffer(ffi.buffer(column.values, 8 * n), dtype=np.float64).copy()
    if kind == KIND_BOOL:
        return np.frombuffer(ffi.buffer(column.values, n), dtype=np.uint8).astype(bool)
    offsets = np.frombuffer(ffi.buffer(column.offsets, 8 * (n + 1)), dtype=np.uint64).astype(
        np.int64
    )
    data = ffi.buffer(ffi.cast("uint8_t *", column.values), int(offsets[-1]))[:]
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def _dict_builder(names: list[str]) -> Any:
    """A function ``(n, *columns) -> list[dict]`` building one metadata dict per row.

    Generated once per dataset with the field names as constants: a dict display in a
    comprehension is about twice as fast as ``dict(zip(names, row))`` per row. The names
    enter the source only through ``repr``, so any string is safe.
    """
    if not names:
        return lambda n: [{} for _ in range(n)]
    args = ", ".join(f"c{i}" for i in range(len(names)))
    items = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
    values = ", ".join(f"v{i}" for i in range(len(names)))
    comma = "," if len(names) == 1 else ""
    source = f"def build(n, {args}):\n    return [{{{items}}} for {values}{comma} in zip({args})]\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, "<dataset_rt metadata>", "exec"), namespace)
    return namespace["build"]


def _payloads(batch: Any, n: int) -> list[bytes]:
    """Copy each payload of a batch into a bytes object (the one copy a sample costs).

    Payloads live in several native buffers. One cffi buffer spanning from the lowest
    payload address to the highest end lets each payload be sliced out with one C-level
    copy; slicing reads only the payloads' own bytes, never the gaps between buffers.
    """
    if n == 0:
        return []
    starts = ffi.unpack(ffi.cast("uint64_t *", batch.payloads), n)
    lengths = ffi.unpack(batch.payload_lens, n)
    base = min(starts)
    end = max(map(sum, zip(starts, lengths)))
    span = ffi.buffer(ffi.cast("uint8_t *", base), end - base)
    return [span[a - base : a - base + length] for a, length in zip(starts, lengths)]


def _column_values(column: Any, kind: int, n: int) -> list[Any]:
    """One metadata column of a native batch as a list of Python values."""
    if kind == KIND_INT:
        return ffi.unpack(ffi.cast("int64_t *", column.values), n)
    if kind == KIND_FLOAT:
        return ffi.unpack(ffi.cast("double *", column.values), n)
    if kind == KIND_BOOL:
        return ffi.unpack(ffi.cast("_Bool *", column.values), n)
    offsets = ffi.unpack(column.offsets, n + 1)
    data = ffi.buffer(ffi.cast("uint8_t *", column.values), offsets[-1])[:]
    return [data[a:b].decode("utf-8") for a, b in pairwise(offsets)]
