"""`CachedDataset`: caches loaded together, read in a deterministic order.

The native dataset owns every piece of state that decides what is read: the caches, the
active table, the stream position (ordered cursor or draw counter) and the epoch length.
Python adapts types: it turns native batches (one payload arena plus typed metadata
columns) into ``CachedSample`` tuples, a batch at a time.
"""

from __future__ import annotations

import inspect
import operator
import os
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from itertools import chain, repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from dataset_rt import _native, manifests, remote, snapshot, writer
from dataset_rt import metadata as _metadata
from dataset_rt.config import ReaderConfig
from dataset_rt.records import CachedSample

if TYPE_CHECKING:  # Polars is imported when a table is first needed
    import polars as pl

    from dataset_rt.records import ManifestUpdateError, ManifestUpdateReport, Result

IO_BACKEND_ENV = "DATASET_RT_IO_BACKEND"

# Samples requested per native call. The native side caps a batch at half the
# prefetch_size window unless it is contiguous (see CachedDataset._generate).
BATCH_SAMPLES_MAX = 4096
# Per-sample iteration asks for contiguous batches while the records of the previous
# batch are all shorter than this: for them the per-batch Python work outweighs the
# native copy into one buffer; larger records stay in the read buffers until their one
# copy into bytes.
CONTIGUOUS_RECORD_BYTES = 16 << 10
# The payload bytes a contiguous batch aims at: enough samples to spread the per-batch
# work thin, few enough that the batch's arena and bytes objects stay in the CPU caches
# until consumed (2 MiB batches measured slower than 64-256 KiB ones). Held until the
# next call, besides the prefetch budget.
CONTIGUOUS_BATCH_BYTES = 256 << 10
# Payloads at least this long are read by the I/O backend straight into the bytes
# objects handed out (``_native.PayloadBuffers``; the native side takes uncompressed
# records of 64 KiB and more so): one copy out of the page cache, on the backend's
# threads, none on the consumer. Measured warm in one process, buffers on (with
# PAYLOAD_AHEAD_BYTES) vs off, medians of 7 rounds, 2 cores, io_uring / threads: 64 KiB
# records -7% / +8%, 128 KiB +3% / -18%, 256 KiB -2% / +14%, 512 KiB +16% / +10%, 1 MiB
# +13% / +41%, 4 MiB -8% / +27%. Below 256 KiB handing buffers over costs about what the
# copy it saves does.
PAYLOAD_BUFFER_BYTES = 256 << 10
# Bytes of such objects given ahead (the read-ahead then; within the prefetch byte
# budget), at least 2 objects. A fixed count fits no range of sizes: 2 (io_uring) or 8
# (threads) objects read 64 KiB records 5x and 1.7x slower than without buffers (too
# few in flight for their size).
PAYLOAD_AHEAD_BYTES = 8 << 20
# Bounded: a batch sized by the previous records' lengths never holds much more than the
# byte budget when larger records follow.
_CONTIGUOUS = int(_native.BatchFlag.CONTIGUOUS | _native.BatchFlag.BOUNDED)

_new_sample = tuple.__new__


def _native_options(reader_config: Any) -> _native.DatasetOptions:
    """The dataset options of a (possibly duck-typed) ReaderConfig, its fields extracted
    as 0.4.8 extracts them: integers by ``__index__`` (``TypeError`` for ``"1"``), flags
    as ``bool`` (``TypeError`` for ``"no"``, which would be truthy)."""
    seed = operator.index(reader_config.seed)
    prefetch_size = operator.index(reader_config.prefetch_size)
    if seed < 0 or prefetch_size < 0:
        raise OverflowError("can't convert negative int to unsigned")
    if seed >= 2**64 or prefetch_size >= 2**64:
        raise OverflowError("int too big to convert")
    if prefetch_size == 0:
        raise ValueError("prefetch_size must be greater than zero")
    backend = getattr(reader_config, "io_backend", "auto")
    if backend == "auto":
        backend = os.environ.get(IO_BACKEND_ENV, "auto") or "auto"
    if backend not in _native.IO_BACKENDS:
        raise ValueError(
            f"unknown io_backend {backend!r}; expected 'auto', 'io_uring' or 'threads'"
        )
    shuffle = writer.extract_bool(reader_config.shuffle)
    validate_cache = writer.extract_bool(reader_config.validate_cache)
    permutation = getattr(reader_config, "sampling", "with_replacement") == "permutation"
    return _native.DatasetOptions(
        seed=seed,
        prefetch_size=prefetch_size,
        shuffle=shuffle,
        validate_cache=validate_cache,
        io_backend=_native.IO_BACKENDS[backend],
        sampling=_native.Sampling.PERMUTATION if permutation else _native.Sampling.WITH_REPLACEMENT,
    )


def probe_cache(
    runtime: _native.Runtime, path: Path | str, *, validate: bool
) -> tuple[str | None, str | None]:
    """``(None, fingerprint)`` when ``path`` opens as a complete cache (checksums verified
    when ``validate``; fingerprint None when it has none), else ``(error message, None)``.

    A remote cache's open verifies only its index and metadata: with ``validate`` every
    record is read too, which fetches each shard whole and verifies it (a full download
    into the shard cache, where later reads find it)."""
    url = remote.is_url(path)
    options = _native.DatasetOptions(
        seed=0, prefetch_size=64 if url else 1, shuffle=False, validate_cache=bool(validate)
    )
    try:
        if url:
            handle = _native.Dataset.open_remote(runtime, [path], options, remote.remote())
        else:
            handle = _native.Dataset.open(runtime, [path], options)
    except (ValueError, RuntimeError, OverflowError) as exc:
        return str(exc), None
    with handle:
        if url and validate:
            try:
                with _native.Iterator.open(handle) as records:
                    while records.next_batch(4096).count:
                        pass
            except (ValueError, RuntimeError) as exc:
                return str(exc), None
        return None, handle.cache_info(0).fingerprint


def _dir_identities(paths: Sequence[Path | str]) -> tuple[tuple[int, int] | None, ...]:
    """``(st_dev, st_ino)`` of each local cache directory (its path followed, as the
    library opens it; None for a URL, whose files are addressed by their content): what
    a reader opened later from a snapshot of the dataset must find at the same paths."""
    identities: list[tuple[int, int] | None] = []
    for path in paths:
        if remote.is_url(path):
            identities.append(None)
        else:
            st = os.stat(path)
            identities.append((st.st_dev, st.st_ino))
    return tuple(identities)


# Datasets whose Python locks a forked child makes new: a lock that another thread of the
# parent held at the fork never comes free in the child, where a call would then hang
# before reaching the library (which raises its fork error, `_native.FORK_MESSAGE`).
_OPEN: weakref.WeakSet[CachedDataset] = weakref.WeakSet()


def _unlock_in_child() -> None:
    for dataset in list(_OPEN):
        dataset._lookup_lock._at_fork_reinit()  # type: ignore[attr-defined]
        dataset._state_lock._at_fork_reinit()  # type: ignore[attr-defined]


os.register_at_fork(after_in_child=_unlock_in_child)


class CachedDataset:
    """Caches loaded as one dataset, in ``cache_paths`` order.

    Not constructed directly: use ``DatasetRuntime.cached_dataset`` or
    ``DatasetRuntime.from_cache_sources``. Iterating yields ``CachedSample`` records; each
    iterator takes the next ``len(dataset)`` positions of the dataset's stream when its
    first sample is requested.
    """

    #: As given: ``Path`` for local caches, ``str`` for URLs (``s3://...``).
    cache_paths: list[Path | str]
    reader_config: ReaderConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("use DatasetRuntime.cached_dataset() to create a CachedDataset")

    @classmethod
    def _open(
        cls,
        runtime: _native.Runtime,
        paths: list[Path | str],
        reader_config: ReaderConfig,
        transport: _native.Remote | None = None,
        name_every_damaged_file: bool = False,
    ) -> CachedDataset:
        """Open ``paths``; URLs fetch through ``transport`` (default: ``remote.remote()``,
        the environment's local directory). ``name_every_damaged_file`` (with
        ``validate_cache``, for ``dataset-rt verify``): a damaged cache's error names
        each damaged file on a line of its own, not only the first (a cache on object
        storage has every shard downloaded and verified at open)."""
        options = _native_options(reader_config)._replace(
            name_every_damaged_file=name_every_damaged_file
        )
        if not paths:
            raise ValueError("CachedDataset requires at least one cache path")
        if any(remote.is_url(p) for p in paths):
            # URLs are caches on object storage (dataset_rt.remote; the core fetches them).
            handle = _native.Dataset.open_remote(
                runtime, [str(p) for p in paths], options, transport or remote.remote()
            )
        else:
            handle = _native.Dataset.open(runtime, paths, options)
        try:
            identities = _dir_identities(paths)
        except OSError:
            handle.close()
            raise
        prefetch_bytes = int(getattr(reader_config, "prefetch_bytes", 0))
        if prefetch_bytes:
            if not 0 < prefetch_bytes < 2**64:
                handle.close()
                raise OverflowError("prefetch_bytes does not fit in 64 bits")
            handle.set_prefetch_bytes(prefetch_bytes)
        self = object.__new__(cls)
        self.cache_paths = list(paths)
        self.reader_config = reader_config
        # What the dataset reads with (callers may rebind the public attribute, which
        # then changes nothing, as in 0.4.8): exports and stream states use this one.
        self._reader_config = reader_config
        #: (st_dev, st_ino) of each local cache directory as opened (None: a URL).
        self._dir_identities = identities
        self._runtime = runtime
        self._handle = handle
        self._lookup: _native.Lookup | None = None
        self._lookup_lock = threading.Lock()
        self._columns = handle.fields()
        self._field_names = [name for name, _ in self._columns]
        self._kinds = [int(kind) for _, kind in self._columns]
        self._make_dicts = _dict_builder(self._field_names)
        self._state_lock = threading.RLock()
        _OPEN.add(self)
        self._active: Any = None
        self._active_arrow: Any = None  # a pyarrow active table not yet seen by Polars
        self._custom_table = False
        # Progress of the latest iterator, for state_dict(): [start, count, base, rest,
        # closed] (see _Progress).
        self._progress: _Progress | None = None
        # iter_batches(copy=True)'s reused payload memory, kept from epoch to epoch.
        self._batch_memory = _BatchMemory()
        # The batches' metadata frames (slices of stored rows read in chunks).
        self._frames = _StoredFrames(handle, self._columns, not reader_config.validate_cache)
        return self

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle 'builtins.CachedDataset' object")  # 0.4.8's text

    def __copy__(self) -> CachedDataset:
        """``copy.copy``: another handle on this dataset that shares all of its state (as
        0.4.8's copy shares its native state): the active table, the stream position, the
        epoch length and the attributes. A change made through one shows through the
        other."""
        other = object.__new__(type(self))
        other.__dict__ = self.__dict__
        return other

    def __len__(self) -> int:
        epoch_len = self._handle.epoch_len()
        if epoch_len > 2**63 - 1:
            raise OverflowError()
        return epoch_len

    def set_epoch_len(self, epoch_len: int) -> None:
        """Set the number of samples each future iterator yields (1 to ``2**63 - 1``, what
        ``len()`` can return).

        Does not move the stream position; iterators already started keep theirs. A
        length of ``2**63`` or more raises ``OverflowError`` and changes nothing (0.4.8
        sets it and then raises from ``len()``).
        """
        if epoch_len < 1:
            raise ValueError("epoch_len must be at least 1")
        value = operator.index(epoch_len)
        if value >= 2**64:
            raise OverflowError("int too big to convert")
        if value >= 2**63:
            raise OverflowError(f"epoch_len must be below 2**63, got {value}")
        self._handle.set_epoch_len(value)

    @property
    def io_backend(self) -> str:
        """The read I/O backend in use: ``"io_uring"`` or ``"threads"``."""
        return _native.IO_BACKEND_NAMES[self._handle.io_backend()]

    @property
    def io_stats(self) -> dict[str, int]:
        """Read counters since the dataset was opened: ``uring_reads``, ``pool_reads``
        (prefetch reads by backend), ``lookup_reads`` (``get_item``, ``get_items``) and
        ``bytes_read``. Iterators serve records under 16 KiB whose pages are in the page
        cache from a mapping of the shard (or, in shuffled reads beyond the mapping budget,
        with one inline read each): they count in ``bytes_read`` only."""
        return self._handle.io_stats()._asdict()

    def __iter__(self) -> Iterator[CachedSample]:
        return self._generate()

    def _generate(self, positions: _native.IterRange | None = None) -> _SampleStream:
        """Samples of the dataset's next window, or of explicit ``positions`` (which
        neither reads nor moves the dataset's stream and is not tracked for state_dict).
        Lazy: nothing native happens (no window is reserved) until the first next(). The
        native iterator is closed when the stream ends, is closed, or is dropped."""
        return _SampleStream.over(self._sample_runs(positions))

    def _sample_runs(self, positions: _native.IterRange | None) -> Iterator[Iterator[CachedSample]]:
        """The samples of :meth:`_generate`, one iterator per native batch (its samples
        are made as they are consumed; the next batch is asked for once they all are)."""
        if positions is None:
            iterator = _native.Iterator.open(self._handle)
            progress = self._track(iterator)
        else:
            iterator = _native.Iterator.open_range(self._handle, positions)
            progress = _Progress(0, 0)
        # The first batch is one sample (the native side plans the first record alone);
        # each later one takes its shape from the previous batch's record sizes.
        count_max, flags = BATCH_SAMPLES_MAX, 0
        # Large payloads: bytes objects the next reads fill (None while records are small).
        buffers: _native.PayloadBuffers | None = None
        try:
            while True:
                batch = iterator.next_batch(count_max, flags)
                count = batch.count
                if count == 0:
                    return
                samples, rest, longest = self._samples(batch, buffers)
                progress.base += count
                progress.rest = rest
                if buffers is not None or longest >= PAYLOAD_BUFFER_BYTES:
                    if buffers is None:
                        buffers = _native.PayloadBuffers(iterator)
                    # Sized by the longest payload, as records ahead are likely alike
                    # (a record of another length is read and copied as before).
                    buffers.top_up(
                        longest if longest >= PAYLOAD_BUFFER_BYTES else 0,
                        PAYLOAD_AHEAD_BYTES,
                    )
                    if buffers.pending:
                        # Buffers given are delivered by non-contiguous batches only.
                        count_max, flags = BATCH_SAMPLES_MAX, 0
                        yield samples
                        continue
                    buffers = None
                if longest < CONTIGUOUS_RECORD_BYTES:
                    # Small records: a contiguous batch is not limited to half the
                    # prefetch window (its payloads are copied out of the read buffers
                    # natively), so the per-batch work is spread over many samples.
                    # Sized by the longest record, as records ahead are likely alike.
                    flags = _CONTIGUOUS
                    count_max = CONTIGUOUS_BATCH_BYTES // max(longest, 1)
                    count_max = max(1, min(BATCH_SAMPLES_MAX, count_max))
                else:
                    # Large records: the payloads stay in the read buffers until the
                    # next call (one copy each, into their bytes objects), unless read
                    # into given bytes objects (above).
                    count_max, flags = BATCH_SAMPLES_MAX, 0
                yield samples
        finally:
            progress.closed = True
            if progress.rest is not None:
                # Closed mid-batch: the batch's samples (held by the stream) end too.
                deque(progress.rest, maxlen=0)
            iterator.close()

    def _track(self, iterator: _native.Iterator) -> _Progress:
        """Record ``iterator`` (just opened) as the latest, for :meth:`state_dict`."""
        window = iterator.window()
        progress = _Progress(window.start, window.count)
        with self._state_lock:
            self._progress = progress
        return progress

    def _iter_range(
        self, start: int, count: int, block_len: int = 0, block_stride: int = 0
    ) -> Iterator[CachedSample]:
        """Samples at explicit stream positions (``drt_iter_open_range``): sample ``k`` is
        position ``start + k // block_len * block_stride + k % block_len`` (``start + k``
        when ``block_len`` is 0). Neither reads nor moves the dataset's own stream."""
        if count <= 0:
            return iter(())
        return self._generate(_native.IterRange(start, count, block_len, block_stride))

    def _range_batches(
        self, start: int, count: int, block_len: int = 0, block_stride: int = 0
    ) -> _RangeBatches:
        """Contiguous native batches at explicit stream positions (as :meth:`_iter_range`
        numbers them), for adapters that build their own batch types without per-sample
        objects. Opens the native iterator now; close it (or use ``with``)."""
        positions = _native.IterRange(start, count, block_len, block_stride)
        return _RangeBatches(_native.Iterator.open_range(self._handle, positions), self._columns)

    def _samples(
        self, batch: _native.Batch, buffers: _native.PayloadBuffers | None = None
    ) -> tuple[Iterator[CachedSample], Iterator[int], int]:
        """Python records for one native batch (copies everything out of it now), made
        as they are consumed; an iterator whose ``length_hint`` is the samples not yet
        made; and the length of the longest payload.

        Per-batch work is a handful of C-level copies (see ``_native.Batch.rows``) and
        the metadata dicts; per-sample work is one payload ``bytes``, one dict and one
        tuple, made by C-level loops (no bytecode per sample but the dict display). The
        ``CachedSample`` tuples (the only objects here the garbage collector tracks)
        are made one at a time as the consumer takes them, so a collection never
        traverses (and promotes) a whole batch of them waiting in a list.
        """
        payloads, cache_ids, sample_ids, columns, longest = batch.rows(self._kinds, buffers)
        rows = self._make_dicts(len(payloads), *columns)
        # zip takes one item of each per sample made, so `rest` holds those not yet made.
        rest = iter(sample_ids)
        samples = map(_new_sample, repeat(CachedSample), zip(payloads, rows, cache_ids, rest))
        return samples, rest, longest

    def iter_batches(self, batch_size: int, *, copy: bool = True) -> Iterator[SampleBatch]:
        """Iterate the same stream as ``iter(dataset)``, a batch of samples at a time.

        Takes one window (``len(dataset)`` samples) like a per-sample iterator, on the first
        ``next()``. Each :class:`SampleBatch` holds up to ``batch_size`` samples (the last one
        may be shorter): the payloads as one contiguous ``numpy.uint8`` array with
        ``len + 1`` offsets, the identities as ``numpy.uint64`` arrays, and the metadata
        as a Polars frame.

        Metadata: each sample's row of its cache's ``metadata.arrow`` as written (row =
        ``sample_id``), gathered natively without parsing the record's embedded JSON. For
        every cache a writer produced this equals what per-sample reads return (the
        embedded JSON; floats bit for bit, NaN and infinities included). It is never the
        active table: values edited with ``update_metadata`` do not appear. A record
        whose embedded JSON is broken or was edited after writing fails (or differs in)
        per-sample reads but not batches; with ``validate_cache=True`` batches parse and
        compare the JSON too and raise the per-sample error (see
        docs/compatibility.md). The frame of a batch of consecutive samples of one cache
        (an ordered read) is a slice of a frame of up to 16 batches' rows (at most about
        8 MiB) read once for them all, which a frame kept alive keeps too; the dataset
        keeps such frames for later epochs (at most 32 MiB of them, the least recently
        used dropped first). Any other batch's frame is its own.

        Lifetime: with ``copy=True`` (the default) the arrays stay valid as long as the
        caller keeps them (or any view of them). Each payload is copied once, natively,
        into the batch's memory (sized from the previous batch; the dataset's first
        batch, and one larger than foreseen, is copied twice): small records from the
        shard mapping or a read buffer, large uncompressed ones (64 KiB or more) read
        straight into it by the I/O backend's threads (on ``io_uring`` shared with the
        calling thread, which waits for the batch anyway). Batches of 8 MiB or more are
        built in a pool the dataset keeps (about three of its largest batches, at most 1 GiB;
        pages faulted in once, not per batch): ``data`` is a view of it, whose space comes
        back for a later batch when ``data`` and every view of it are gone (a
        ``memoryview`` or a buffer handed to C keeps it, as the buffer protocol does). A
        consumer that keeps batches gets fresh memory (owned by its arrays) once the pool
        is full: the pool never grows for it. Smaller batches own fresh memory; of those,
        batches of small uncompressed records read in order from the page cache whose
        records take 256 KiB or more (1 MiB or more where a shard is not among those
        the dataset keeps mapped, up to 256 MiB of them) are staged two ahead (with at
        least two runtime workers): workers copy each payload into the batch's memory
        while the caller works on the batch it has, out of the dataset's mapping of its
        shard (or read each record there and move its payload down over its header and
        JSON), so the calling thread copies nothing (that memory is sized for the
        records whole: a little more than the payloads).

        With ``copy=False``, ``data``,
        ``cache_id`` and ``sample_id`` are zero-copy views of the native batch buffer,
        valid only until the next batch is requested or the iterator is closed. Do not
        read them later: they show other samples' bytes, or, once a larger batch has
        moved the buffer, memory already freed (which can crash the process, as any view
        of freed native memory can). That buffer is reused batch after batch
        (large uncompressed records are read straight into it) and kept by the dataset
        for its next iterator: about one batch's bytes, until the dataset is closed. Use
        it when each batch is consumed (or copied, e.g. into a pinned tensor) before the
        next one.
        """
        size = operator.index(batch_size)
        if size < 1:
            raise ValueError("batch_size must be at least 1")
        return self._generate_batches(size, bool(copy))

    def _generate_batches(self, size: int, copy: bool) -> Iterator[SampleBatch]:
        iterator = _native.Iterator.open(self._handle)
        progress = self._track(iterator)
        try:
            if copy:
                # Payloads copied once, from the iterator's read buffers into reused memory.
                gather = _Gather(iterator, self._frames, self._batch_memory)
                while True:
                    built = gather.next(size)
                    if built is None:
                        return
                    progress.base += len(built.cache_id)
                    yield built
            while True:
                batch = iterator.next_batch(size, _BATCH_FLAGS)
                count = batch.count
                if count == 0:
                    return
                progress.base += count
                yield _sample_batch(batch, self._frames, copy)
        finally:
            progress.closed = True
            iterator.close()

    def _stream(self) -> tuple[int, int]:
        """The native stream state: (next position, end of a pending partial window)."""
        position, window_end = self._handle.stream()
        return position, window_end

    def table_digest(self) -> str:
        """Hex SHA-256 identifying the active table (rows, order and weights; for the
        table a dataset opens with, its caches' ids and sizes). Computed natively, once
        per table."""
        return self._handle.table_digest().hex()

    def state_dict(self) -> dict[str, Any]:
        """The stream state, to continue exactly where this dataset is now.

        ``position`` is the stream position (ordered cursor or draw number) of the next
        sample: after the samples the latest iterator (per-sample or batch) has handed
        out. When that iterator is still open and unfinished, ``window_end`` is the end of
        its window (modulo 2**64, as positions are), and after :meth:`load_state_dict`
        the next iterator yields just the rest of it, so the continued stream equals the
        uninterrupted one sample for sample; an iterator that was closed early has given
        up its window (as it would have in the uninterrupted run). Older iterators still
        running are not described. Small: a few integers, the reading options and
        ``table_digest``.
        """
        with self._state_lock:
            progress = self._progress
            position, window_end = self._stream()
        if progress is not None and not progress.closed and progress.taken() < progress.count:
            position = (progress.start + progress.taken()) % 2**64
            window_end = (progress.start + progress.count) % 2**64
        return {
            "format": STATE_FORMAT,
            "position": position,
            "window_end": window_end,
            "epoch_len": len(self),
            "shuffle": bool(self._reader_config.shuffle),
            "seed": int(self._reader_config.seed),
            "sampling": getattr(self._reader_config, "sampling", "with_replacement"),
            "table_digest": self.table_digest(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the stream a :meth:`state_dict` describes.

        The dataset must read the same stream: same active table (checked by digest;
        call ``update_metadata`` with the same table first when it was changed), shuffle,
        seed and sampling mode; otherwise ``ValueError`` says what differs and nothing
        changes. Sets the epoch length and the stream position; iterators already open
        are unaffected.
        """
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a dataset_rt dataset state (expected format {STATE_FORMAT!r})")
        mine = self.state_dict()
        for key in ("shuffle", "seed", "sampling"):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"state was saved with {key}={state.get(key)!r}, this dataset reads with "
                    f"{key}={mine[key]!r}"
                )
        if state.get("table_digest") != mine["table_digest"]:
            raise ValueError(
                "state was saved for a different active table (digest "
                f"{str(state.get('table_digest'))[:16]}..., this dataset's is "
                f"{mine['table_digest'][:16]}...); restore the same metadata table first"
            )
        position, window_end = _u64(state, "position"), _u64(state, "window_end")
        epoch_len = state.get("epoch_len")
        if type(epoch_len) is not int or not 1 <= epoch_len < 2**63:
            raise ValueError(f"state['epoch_len'] must be from 1 to 2**63 - 1, got {epoch_len!r}")
        self.set_epoch_len(epoch_len)
        stream = _native.Stream(position, window_end)
        with self._state_lock:
            self._handle.set_stream(stream)
            self._progress = None

    def get_item(self, cache_id: int, sample_id: int) -> CachedSample:
        """The stored sample ``(cache_id, sample_id)`` with its embedded metadata.

        Random access: works for rows outside the active table and moves no cursor.
        """
        return self._get_item(cache_id, sample_id)

    def _first_get_item(self, cache_id: int, sample_id: int) -> CachedSample:
        """``get_item`` before the first read: refuses bad arguments as every later call
        does (before any native call), then opens the lookup handle if ``get_items`` has
        not, binds the row getter to it (``_native.row_getter``: the argument checks, the
        lock, one C call, the unpacking) and reads through it from now on: the getter is
        also the instance's own ``get_item`` attribute (same name, documentation and
        behaviour as the method), so a call no longer passes through the method's frame."""
        if (
            type(cache_id) is not int
            or type(sample_id) is not int
            or not (0 <= cache_id < _U64_END and 0 <= sample_id < _U64_END)
        ):
            raise _refusal(cache_id, sample_id)
        with self._lookup_lock:
            lookup = self._lookup
            if lookup is None:
                # One lookup handle (with its call buffers) per dataset, reused by every call.
                lookup = self._lookup = _native.Lookup.open(self._handle)
            if self._get_item == self._first_get_item:
                getter = _native.row_getter(
                    lookup,
                    self._lookup_lock,
                    self._field_names,
                    self._kinds,
                    CachedSample,
                    _refusal,
                )
                method = CachedDataset.get_item
                getter.__name__, getter.__qualname__ = method.__name__, method.__qualname__
                getter.__doc__ = method.__doc__
                self._get_item = getter
                # Shadows the method (a non-data descriptor) for this instance.
                self.__dict__["get_item"] = getter
        return self._get_item(cache_id, sample_id)

    # get_item's reader until the first call sets the instance's own (a closure holding
    # no reference to the dataset, so no reference cycle).
    _get_item: Callable[[int, int], CachedSample] = _first_get_item

    def get_items(self, cache_ids: Any, sample_ids: Any, *, copy: bool = True) -> SampleBatch:
        """The stored samples ``(cache_ids[i], sample_ids[i])``, in this order, as one
        :class:`SampleBatch` (the type :meth:`iter_batches` yields): what ``get_item``
        returns for each identity, without a Python object per sample.

        ``cache_ids`` and ``sample_ids`` are sequences of ``int`` or one-dimensional numpy
        integer arrays of the same length (uint64 arrays are passed to the library by
        pointer). Identities may repeat and mix caches; like ``get_item``, rows outside the
        active table can be read and no cursor moves. The reads are planned like an
        iterator's: each distinct record is read once, in shard and offset order, adjacent
        records in one read; the batch lists the samples in the caller's order. The
        metadata comes from ``metadata.arrow`` as for :meth:`iter_batches` (equal to
        ``get_item``'s for every cache a writer produced).

        Errors: one bad identity fails the whole call (nothing is returned) with the
        exception ``get_item`` raises for the first failing identity in the caller's order,
        same type and message (``TypeError`` for a non-integer, ``IndexError`` naming the
        identity that is out of range, ``RuntimeError``/``ValueError`` for an unreadable
        record: an I/O error names its file); a broken embedded JSON is an error only with
        ``validate_cache=True`` (as for :meth:`iter_batches`). Mismatched lengths or a
        non-1-D array raise ``ValueError``. An empty request returns an empty batch.

        Lifetime: as for :meth:`iter_batches`; with ``copy=False`` the arrays ``data``,
        ``cache_id`` and ``sample_id`` are views of native memory, valid only until the
        next ``get_item`` or ``get_items`` call on this dataset (and must not be read
        after it, as for :meth:`iter_batches`). They keep the memory they show alive:
        dropping the dataset before them is safe.
        """
        cids, sids, bad = _identity_arrays(cache_ids, sample_ids)
        with self._lookup_lock:
            lookup = self._lookup
            if lookup is None:
                lookup = self._lookup = _native.Lookup.open(self._handle)
            if bad is not None:
                # Identities before the first one Python refuses come first: the library
                # may fail on one of them.
                position, error = bad
                lookup.get_arrays(cids[:position], sids[:position], _BATCH_FLAGS)
                raise error
            if len(cids) == 0:
                return _empty_batch(self._columns)
            if not copy:
                batch = lookup.get_arrays(cids, sids, _BATCH_FLAGS)
                return _sample_batch(batch, self._frames, False)
            # Owned arrays: the payloads are gathered once, straight from where they were
            # read (or mapped), into the batch's own array.
            batch = lookup.get_arrays(cids, sids, _native.BatchFlag.STORED_METADATA)
            return _gathered_batch(batch, self._frames)

    def get_metadata(self) -> pl.DataFrame:
        """The active metadata table as a Polars DataFrame.

        Before any update: ``cache_id`` (UInt64), ``sample_id`` (UInt64), the stored
        columns in manifest order, ``weight`` (Float64, all 1.0), one row per physical
        sample in path order, built from the memory-mapped ``metadata.arrow`` files. After
        ``update_metadata(metadata)``: equal to ``metadata``. Each call returns a new frame
        (a Polars clone, which shares the column buffers), so changing it in place
        (``drop_in_place``, ``insert_column``) leaves the active table as it is. Never
        touches the cache files.
        """
        with self._state_lock:
            if self._active is None:
                import polars as pl

                _native.check_owner(self._runtime.pid)  # Polars would hang in a fork
                if self._active_arrow is not None:
                    self._active = pl.from_arrow(self._active_arrow)
                else:
                    self._active = _metadata.default_table(self)
            return self._active.clone()

    def samples_metadata(self) -> pl.DataFrame:
        """Alias of :meth:`get_metadata`."""
        return self.get_metadata()

    def update_metadata(self, metadata: pl.DataFrame) -> None:
        """Replace the active table that future iterators sample from.

        ``metadata`` (a Polars DataFrame) needs the stored metadata columns with their Arrow
        types, and ``cache_id``, ``sample_id`` (integers naming existing samples) and
        ``weight`` (positive, finite) columns; rows may be filtered, reordered or
        duplicated and extra columns are kept. The whole table is validated natively
        first; on any error (``ValueError``) nothing changes. On success the cursor and
        draw stream restart at 0, shuffled reading switches to weighted draws, and the
        epoch length becomes the row count. Cache files are never rewritten. The table
        kept is a clone: changing ``metadata`` in place afterwards does not change it.
        """
        _native.check_owner(self._runtime.pid)
        with self._state_lock:
            _metadata.validate_and_set(self, metadata)
            self._table_replaced(metadata.clone(), None)

    def _set_arrow_table(self, table: Any) -> None:
        """``update_metadata`` for a pyarrow table (a snapshot's), without Polars."""
        with self._state_lock:
            _metadata.set_arrow_table(self, table)
            self._table_replaced(None, table)

    def _table_replaced(self, frame: Any, arrow: Any) -> None:
        """Python-side state after the native table was replaced (under _state_lock)."""
        self._active = frame
        self._active_arrow = arrow
        self._custom_table = True
        self._progress = None

    def set_samples_metadata(self, metadata: pl.DataFrame) -> None:
        """Alias of :meth:`update_metadata`."""
        self.update_metadata(metadata)

    def update_manifests(
        self, version: Literal[3]
    ) -> Result[ManifestUpdateReport, ManifestUpdateError]:
        """Rewrite format-2 manifests of this dataset's caches as format 3 (atomically).

        All or nothing: every manifest is first checked against the one this dataset
        loaded (missing, invalid, downgraded, re-identified, changed, or the same file
        twice), and the first failure returns ``Err(ManifestUpdateError(path, message,
        ()))`` with no file written. Otherwise returns ``Ok(ManifestUpdateReport)``; see
        the storage-format docs. Sample files, the active table and cursors are unchanged.
        """
        _native.check_owner(self._runtime.pid)
        return manifests.update_manifests(self, version)

    def dump_config(self, path: str | os.PathLike[str]) -> Path:
        """Write ``dataset.json`` and the active table (``metadata.arrow``) into the
        existing directory ``path``; returns the ``dataset.json`` path (absolute, with
        symbolic links resolved)."""
        _native.check_owner(self._runtime.pid)
        return snapshot.dump_config(self, path)

    @classmethod
    def from_config(cls, path: str | os.PathLike[str]) -> CachedDataset:
        """Rebuild a dataset (new runtime, same caches, active table and epoch length)
        from a ``dataset.json`` written by :meth:`dump_config`. The stream starts at 0."""
        config, table = snapshot.load_config(path)
        runtime = _native.Runtime.open(config.num_workers)
        dataset = cls._open(runtime, list(config.cache_paths), config.reader_config)
        dataset._set_arrow_table(table)  # update_metadata's checks, without Polars
        dataset.set_epoch_len(config.epoch_len)
        return dataset

    def to_torch_iterable_dataset(self) -> Any:
        """A sized ``torch.utils.data.IterableDataset`` over this dataset's stream.

        In the training process each ``iter()`` is ``iter(dataset)``. Unlike dataset-rt
        0.4.8 (which raises), it also works in DataLoader workers: worker ``w`` of ``W``
        reads its contiguous part of each window (``len(dataset)`` positions) of the
        stream from the dataset's position when this was called, one window per epoch,
        from its own reader. Needs PyTorch (``pip install 'dataset-rt-zig[torch]'``).
        """
        adapters = _torch_adapters("to_torch_iterable_dataset")
        _native.check_owner(self._runtime.pid)
        return adapters.to_torch_iterable_dataset(self)

    def to_torch_dataloader(
        self,
        *,
        batch_size: int = 1,
        sample_transform_fn: Callable[[CachedSample], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        shuffle: bool = True,
        seed: int | Literal["random"] = "random",
        samples_per_epoch: int | None = None,
        worker_partition: Literal["split", "replicate", "global"] | None = None,
        work_dir: str | os.PathLike[str] | None = None,
        num_workers: int | Literal["auto"] = "auto",
        drop_last: bool = False,
        pin_memory: bool = False,
        timeout: float = 0,
        native_num_workers: int | Literal["auto"] = "auto",
        multiprocessing_context: Any = "spawn",
        worker_init_fn: Callable[[int], None] | None = None,
        prefetch_factor: int | Literal["auto"] = "auto",
        persistent_workers: bool | Literal["auto"] = "auto",
        verbose: bool = True,
        dataloader_kwargs: Mapping[str, Any] | None = None,
        batch_format: Literal["samples", "tensors"] = "samples",
        batch_transform_fn: Callable[[Any], Any] | None = None,
    ) -> Any:
        """A ``torch.utils.data.DataLoader`` (a ``DatasetRTDataLoader``) over a snapshot
        of this dataset (``dump_config`` into ``work_dir``, or a temporary directory
        removed with the loader); every consumer (this process or each worker, on each
        rank) opens its own reader from it.

        ``worker_partition``: ``"replicate"`` (default when shuffled: each consumer draws
        from all rows with its own seed derived from ``seed``, rank and worker),
        ``"split"`` (default when ordered: consumers read disjoint slices of the rows), as
        in dataset-rt 0.4.8, or ``"global"``: one stream for the whole job (the ordered
        cursor, or the draw stream with ``seed``), cut into batches of ``batch_size``;
        batch ``b`` of a pass goes to consumer ``b mod (ranks x workers)``, so all ranks
        and workers together read every batch of the pass exactly once. Ranks come from
        ``torch.distributed`` when initialized. The budget ``samples_per_epoch`` defaults
        to the dataset's length (``len(dataset)``, including a ``set_epoch_len`` override);
        ``len(loader)`` is this rank's batches per pass.

        ``batch_format="tensors"`` (an extension; the default ``"samples"`` is dataset-rt
        0.4.8's per-sample path) builds each batch from one native batch, without
        per-sample objects: a ``dataset_rt.integrations.torch.TensorBatch`` (payloads as a
        ``uint8`` tensor with offsets, or ``[batch, length]`` when all payloads have the same
        length; identities and numeric metadata as tensors, string metadata as lists),
        the same samples in the same batches and order as the per-sample path. Workers
        build whole batches in shared memory; ``batch_transform_fn`` (picklable with
        workers) runs there on each batch and its result is what the loop receives. It
        takes no ``sample_transform_fn`` or ``collate_fn``.

        The loader has ``state_dict()`` / ``load_state_dict()`` for exact mid-epoch
        resume ("global" also across world sizes). Validation and messages follow
        dataset-rt 0.4.8. Needs PyTorch (``pip install 'dataset-rt-zig[torch]'``).
        """
        adapters = _torch_adapters("to_torch_dataloader")
        _native.check_owner(self._runtime.pid)
        return adapters.to_torch_dataloader(
            self,
            batch_size=batch_size,
            sample_transform_fn=sample_transform_fn,
            collate_fn=collate_fn,
            shuffle=shuffle,
            seed=seed,
            samples_per_epoch=samples_per_epoch,
            worker_partition=worker_partition,
            work_dir=work_dir,
            num_workers=num_workers,
            drop_last=drop_last,
            pin_memory=pin_memory,
            timeout=timeout,
            native_num_workers=native_num_workers,
            multiprocessing_context=multiprocessing_context,
            worker_init_fn=worker_init_fn,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            verbose=verbose,
            dataloader_kwargs=dataloader_kwargs,
            batch_format=batch_format,
            batch_transform_fn=batch_transform_fn,
        )


def _torch_adapters(method: str) -> Any:
    """``dataset_rt.integrations.torch``, or dataset-rt 0.4.8's ImportError for ``method``
    when PyTorch itself cannot be imported (other import errors propagate).

    The one import of a higher layer (the integrations): lazy, so that ``import
    dataset_rt`` never imports torch (tests/test_structure.py allows exactly this edge)."""
    try:
        from dataset_rt.integrations import torch as adapters
    except ImportError as error:
        if (error.name or "").split(".")[0] != "torch":
            raise
        raise ImportError(f"CachedDataset.{method} requires PyTorch to be installed") from error
    return adapters


STATE_FORMAT = "dataset_rt.dataset_state/1"

_U64_END = 2**64

# Batches take their metadata from metadata.arrow (see iter_batches).
_STORED = int(_native.BatchFlag.STORED_METADATA)
_BATCH_FLAGS = int(_native.BatchFlag.CONTIGUOUS) | _STORED


def _identity_arrays(
    cache_ids: Any, sample_ids: Any
) -> tuple[Any, Any, tuple[int, Exception] | None]:
    """``get_items``' identities as two C-contiguous uint64 arrays, and the first
    identity ``get_item`` would refuse before calling the library: ``(position,
    exception)``, or None. Numpy integer arrays are checked in bulk; other sequences
    must hold ``int`` objects (as ``get_item``'s arguments)."""
    import numpy as np

    columns = []
    for name, values in (("cache_ids", cache_ids), ("sample_ids", sample_ids)):
        if isinstance(values, np.ndarray):
            if values.ndim != 1:
                raise ValueError(f"{name} must be one-dimensional")
            # An object array holds Python objects: each is checked, as in a list.
            columns.append(values.tolist() if values.dtype == object else values)
        else:
            try:
                columns.append(list(values))
            except TypeError:
                raise TypeError(f"{name} must be a sequence of integers or a numpy array") from None
    cids, sids = columns
    if len(cids) != len(sids):
        raise ValueError("cache_ids and sample_ids must have the same length")
    out = []
    bad: list[int] = []  # per column, the first position get_item would refuse
    for values in (cids, sids):
        if isinstance(values, np.ndarray):
            if values.dtype == np.uint64:
                out.append(np.ascontiguousarray(values))
                bad.append(len(values))
                continue
            if values.dtype.kind != "i" and values.dtype.kind != "u":
                # Not integers: get_item's TypeError at the first identity.
                out.append(np.zeros(len(values), dtype=np.uint64))
                bad.append(0)
                continue
            negative = np.flatnonzero(values < 0) if values.dtype.kind == "i" else ()
            first = int(negative[0]) if len(negative) else len(values)
            converted = np.zeros(len(values), dtype=np.uint64)
            converted[:first] = values[:first]
            out.append(converted)
            bad.append(first)
            continue
        try:
            if set(map(type, values)) - {int}:
                raise TypeError
            # numpy 1.x wraps a negative Python int into uint64 (with a
            # DeprecationWarning) where numpy 2 raises OverflowError.
            if values and int(np.__version__.split(".", 1)[0]) < 2 and min(values) < 0:
                raise OverflowError
            array = np.array(values, dtype=np.uint64) if values else np.zeros(0, np.uint64)
        except (TypeError, OverflowError, ValueError):
            # Find the first element get_item would refuse (type, then range).
            first = next(
                i for i, v in enumerate(values) if type(v) is not int or not 0 <= v < _U64_END
            )
            array = np.zeros(len(values), dtype=np.uint64)
            array[:first] = values[:first]
            out.append(array)
            bad.append(first)
        else:
            out.append(array)
            bad.append(len(values))
    position = min(bad)
    if position == len(out[0]):
        return out[0], out[1], None
    # Elements of integer arrays stand for the Python ints they hold.
    cache_id, sample_id = (
        int(v[position]) if isinstance(v, np.ndarray) and v.dtype.kind in "iu" else v[position]
        for v in (cids, sids)
    )
    return out[0], out[1], (position, _refusal(cache_id, sample_id))


def _refusal(cache_id: Any, sample_id: Any) -> Exception:
    """The exception ``get_item(cache_id, sample_id)`` raises before calling the library."""
    if type(cache_id) is not int or type(sample_id) is not int:
        return TypeError("cache_id and sample_id must be integers")
    if not 0 <= cache_id < _U64_END:
        return IndexError(f"cache_id {cache_id} is out of range")
    return IndexError(f"sample_id {sample_id} is out of range")


class _SampleStream(chain):  # type: ignore[type-arg]
    """The samples of one iteration: ``itertools.chain`` over the per-batch iterators of
    a generator (``CachedDataset._sample_runs``), plus ``close()``.

    A generator delegating with ``yield from`` resumes its frame for every sample; the
    chain takes each sample from the batch's iterator at C level and resumes the
    generator once per batch (about 200 instructions less per sample, callgrind).
    ``close()`` closes the generator (which closes the native iterator), as closing the
    generator itself did; dropping the stream drops the generator, which closes it.
    """

    __slots__ = ("_runs",)
    _runs: Any

    @classmethod
    def over(cls, runs: Any) -> _SampleStream:
        """The stream of the samples of ``runs`` (a generator of iterators)."""
        stream = cls.from_iterable(runs)
        stream._runs = runs
        return stream

    def close(self) -> None:
        """Stop the iteration now: closes the generator (and so the native iterator)."""
        self._runs.close()

    def __reduce__(self) -> Any:
        """Refused, as for 0.4.8's generator (``copy.copy`` too: a copy would share the
        native iterator with this stream)."""
        raise TypeError("cannot pickle 'generator' object")

    # The rest of the generator protocol (0.4.8's ``iter(dataset)`` is a generator).

    def send(self, value: Any) -> CachedSample:
        """The next sample (``value`` is ignored, as the reference's generator ignores
        it); a value other than None before the first sample raises ``TypeError``, as
        for a generator that has not started."""
        if value is not None and inspect.getgeneratorstate(self._runs) == inspect.GEN_CREATED:
            raise TypeError("can't send non-None value to a just-started generator")
        return next(self)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> CachedSample:
        """Raise an exception where the stream stands, as into a generator that does not
        catch it: the stream is closed (see :meth:`close`) and the exception propagates."""
        self.close()
        if isinstance(typ, BaseException):
            exc = typ
        elif isinstance(val, BaseException):
            exc = val
        else:
            exc = typ() if val is None else typ(val)
        raise exc.with_traceback(tb) if tb is not None else exc


Generator.register(_SampleStream)


class _Progress:
    """How far the consumer got in an iterator's window: ``base`` samples were fetched
    from the native iterator, of which ``rest`` (an iterator with a length hint, see
    ``CachedDataset._samples``) still holds some."""

    __slots__ = ("base", "closed", "count", "rest", "start")

    def __init__(self, start: int, count: int) -> None:
        self.start = start
        self.count = count
        self.base = 0
        self.rest: Any = None
        self.closed = False

    def taken(self) -> int:
        """Samples handed to the consumer so far."""
        pending = operator.length_hint(self.rest) if self.rest is not None else 0
        return self.base - pending


def _u64(state: Mapping[str, Any], key: str) -> int:
    value = state.get(key)
    if type(value) is not int or not 0 <= value < 2**64:
        raise ValueError(f"state[{key!r}] must be an unsigned 64-bit integer, got {value!r}")
    return value


class SampleBatch(NamedTuple):
    """A batch from :meth:`CachedDataset.iter_batches` or :meth:`CachedDataset.get_items`.

    Sample ``i``'s payload is ``data[offsets[i]:offsets[i + 1]]``; its identity is
    ``(cache_id[i], sample_id[i])`` and its stored metadata (its cache's
    ``metadata.arrow`` row) is row ``i`` of ``metadata``.
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


class RawBatch(NamedTuple):
    """One contiguous native batch of :class:`_RangeBatches`: ``data`` (uint8),
    ``cache_id`` and ``sample_id`` (uint64) are views of native memory valid until the
    next batch is requested; ``offsets`` (uint64, ``count + 1``) and the ``columns``
    (metadata name to an int64/float64/bool array, or a list of str; the stored
    ``metadata.arrow`` rows, as :meth:`CachedDataset.iter_batches`) are owned."""

    data: Any
    offsets: Any
    cache_id: Any
    sample_id: Any
    columns: dict[str, Any]


class _RangeBatches:
    """A native range iterator handing out :class:`RawBatch` es of any size."""

    __slots__ = ("_columns", "_iterator")

    def __init__(self, iterator: _native.Iterator, columns: list[tuple[str, int]]) -> None:
        self._iterator = iterator
        self._columns = columns

    def next(self, max_count: int) -> RawBatch | None:
        """Up to ``max_count`` (>= 1) next samples, None at the end. A batch is shorter
        only at the end of the range or right before a read error (which the next call
        raises)."""
        batch = self._iterator.next_batch(max_count, _BATCH_FLAGS)
        if batch.count == 0:
            return None
        data, offsets, cache_id, sample_id = batch.arrays(False)
        columns = {
            name: batch.column_values(i, kind)
            if kind == _native.Kind.STRING
            else batch.column_array(i, kind)
            for i, (name, kind) in enumerate(self._columns)
        }
        return RawBatch(data, offsets, cache_id, sample_id, columns)

    def next_into(self, max_count: int, destination: Any) -> RawBatch | None:
        """Like :meth:`next`, but read without a contiguous copy: ``data`` is the payloads
        gathered with one copy into ``destination`` (a writable ``numpy.uint8`` array),
        ``destination[:n]``, or a new array when they do not fit there. A batch holds at
        most half the reader's ``prefetch_size`` samples (fewer than ``max_count``)."""
        import numpy as np

        batch = self._iterator.next_batch(max_count, _STORED)
        count = batch.count
        if count == 0:
            return None
        lengths, cache_id, sample_id = batch.lengths_and_ids()
        offsets = np.zeros(count + 1, dtype=np.uint64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        target = destination if total <= len(destination) else np.empty(total, dtype=np.uint8)
        batch.copy_payloads(target)
        columns = {
            name: batch.column_values(i, kind)
            if kind == _native.Kind.STRING
            else batch.column_array(i, kind)
            for i, (name, kind) in enumerate(self._columns)
        }
        return RawBatch(target[:total], offsets, cache_id, sample_id, columns)

    def close(self) -> None:
        self._iterator.close()

    def __enter__(self) -> _RangeBatches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sample_batch(batch: _native.Batch, frames: _StoredFrames, copy: bool) -> SampleBatch:
    """One contiguous native batch as numpy arrays (copied, or views when ``copy`` is
    false) and a Polars frame (never the library's memory; see :class:`_StoredFrames`)."""
    data, offsets, cache_id, sample_id = batch.arrays(copy)
    return SampleBatch(data, offsets, cache_id, sample_id, frames.frame(batch))


def _metadata_frame(batch: _native.Batch, columns: list[tuple[str, int]]) -> Any:
    """The embedded metadata of one native batch (contiguous or not) as a Polars frame
    (its own memory): a row per sample, also when the cache has no metadata column."""
    if not columns:
        return _rows_without_columns(batch.count)
    return _frame(_metadata_arrays(batch, columns), columns)


def _rows_without_columns(count: int) -> Any:
    """A Polars frame of ``count`` rows and no column (a list of Series cannot say how
    many rows it has without one; an Arrow batch of a struct of no fields can)."""
    import polars as pl
    import pyarrow as pa

    rows = pa.StructArray.from_buffers(pa.struct([]), count, [None])
    return pl.from_arrow(pa.Table.from_batches([pa.RecordBatch.from_struct_array(rows)]))


def _metadata_arrays(batch: _native.Batch, columns: list[tuple[str, int]]) -> list[Any]:
    """The embedded metadata columns of one native batch (see ``Batch.column_array``)."""
    return [batch.column_array(i, kind) for i, (_, kind) in enumerate(columns)]


def _frame(arrays: list[Any], columns: list[tuple[str, int]]) -> Any:
    """A Polars frame of metadata ``arrays`` (one per column of ``columns``).

    Built from a list of named Series: the same frame as from a dict of the arrays, for
    a sixth of the per-batch cost (Polars' dict path inspects every value in Python)."""
    import polars as pl

    return pl.DataFrame([pl.Series(name, array) for (name, _), array in zip(columns, arrays)])


def _concat_arrays(parts: list[Any]) -> Any:
    """One column from its parts (numpy arrays, or pyarrow string arrays)."""
    import numpy as np

    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    import pyarrow as pa

    return pa.concat_arrays(parts)


# The frames of _StoredFrames: a chunk holds about this many bytes of stored rows (and
# this many times a batch's rows at most); a run whose chunk would hold fewer than
# _CHUNK_BATCHES_MIN batches' rows takes its own frame.
_CHUNK_BYTES = 8 << 20
_CHUNK_BATCHES = 16
_CHUNK_BATCHES_MIN = 4
# The chunks a dataset keeps for later epochs take at most this many bytes in all.
_CHUNK_KEEP_BYTES = 32 << 20
# Bytes a stored row takes in a frame before the first chunk measures it.
_CHUNK_ROW_BYTES_GUESS = 64


class _StoredFrames:
    """The metadata frames of a dataset's batches (``iter_batches``, ``get_items``).

    A batch that is one run of consecutive samples of one cache (``Batch.run``: an
    ordered read, or ids asked for in order) holds rows ``first .. first + count`` of
    that cache's ``metadata.arrow``; its frame is then a zero-copy slice of a *chunk*, a
    frame of many stored rows read once (``Lookup.stored_rows``, no record read).
    Building a Polars frame costs tens of microseconds per column whatever its length,
    which a batch of thousands of small records pays in full, and a chunk pays once for
    many batches. Equal to the batch's own columns (``_metadata_frame``) by
    construction: the same rows, converted by the same code. Any other batch, a run that
    does not continue the previous one (a chunk is read only when reads go on where the
    last one stopped, so random requests never pay for one), a chunk cut short by a row
    holding an Arrow null (whose value is the embedded JSON's), and ``validate_cache``
    (which compares every record's JSON) take the batch's own columns.

    Chunks are kept for later epochs: a run starting where a kept chunk starts (the
    same batch boundaries, epoch after epoch) slices it instead of reading the rows
    again. Stored rows never change, so a kept chunk stays equal to what a read would
    give.

    Bounded: a chunk holds at most about ``_CHUNK_BYTES`` of rows (sized from the bytes
    a row took in the previous chunk) and ``_CHUNK_BATCHES`` batches' rows; the kept
    chunks (the current one among them) take at most ``_CHUNK_KEEP_BYTES`` (the least
    recently used go first), plus the native columns the latest was built from (kept by
    its lookup for the next one); a frame handed out keeps its chunk alive, as a numpy
    view keeps its base. Its own lookup (so it never waits for, or invalidates,
    ``get_item``'s) under its own lock: thread-safe."""

    __slots__ = (
        "_chunk",
        "_enabled",
        "_handle",
        "_kept",
        "_kept_bytes",
        "_lock",
        "_lookup",
        "_next",
        "_row_bytes",
        "columns",
    )

    def __init__(
        self, handle: _native.Dataset, columns: list[tuple[str, int]], enabled: bool
    ) -> None:
        self.columns = columns
        self._handle = handle
        self._enabled = enabled and bool(columns)
        self._lock = threading.Lock()
        self._lookup: _native.Lookup | None = None
        # (cache_id, first row, end row, frame) of the chunk, if any.
        self._chunk: tuple[int, int, int, Any] | None = None
        # Chunks kept for later epochs by (cache_id, first row), least recently used
        # first, with the bytes each frame takes; their total.
        self._kept: OrderedDict[tuple[int, int], tuple[tuple[int, int, int, Any], int]] = (
            OrderedDict()
        )
        self._kept_bytes = 0
        # (cache_id, row) where the latest run ended: a run starting there continues it.
        self._next: tuple[int, int] | None = None
        self._row_bytes = _CHUNK_ROW_BYTES_GUESS

    def frame(self, batch: _native.Batch) -> Any:
        """The metadata of ``batch`` (valid) as a Polars frame."""
        if self._enabled:
            cache_id, first, length = batch.run()
            if length == batch.count and length > 0:
                with self._lock:
                    frame = self._slice(cache_id, first, length)
                if frame is not None:
                    return frame
        return _metadata_frame(batch, self.columns)

    def _slice(self, cache_id: int, first: int, count: int) -> Any:
        """Rows ``first .. first + count`` of cache ``cache_id`` from the chunk (read now
        when the run continues the previous one), or None."""
        end = first + count
        chunk = self._chunk
        continues = self._next == (cache_id, first)
        self._next = (cache_id, end)
        if chunk is None or chunk[0] != cache_id or not chunk[1] <= first <= end <= chunk[2]:
            kept = self._kept.get((cache_id, first))
            if kept is not None and end <= kept[0][2]:
                self._kept.move_to_end((cache_id, first))
                chunk = self._chunk = kept[0]
            elif not continues:
                return None
            else:
                chunk = self._read(cache_id, first, count)
                if chunk is None:
                    return None
        return chunk[3].slice(first - chunk[1], count)

    def _keep(self, chunk: tuple[int, int, int, Any]) -> None:
        """Keep ``chunk`` for later epochs, dropping the least recently used chunks over
        ``_CHUNK_KEEP_BYTES`` (a chunk larger than that alone is not kept)."""
        nbytes = chunk[3].estimated_size()
        old = self._kept.pop((chunk[0], chunk[1]), None)
        if old is not None:
            self._kept_bytes -= old[1]
        while self._kept and self._kept_bytes + nbytes > _CHUNK_KEEP_BYTES:
            self._kept_bytes -= self._kept.popitem(last=False)[1][1]
        if nbytes <= _CHUNK_KEEP_BYTES:
            self._kept[(chunk[0], chunk[1])] = (chunk, nbytes)
            self._kept_bytes += nbytes

    def _read(self, cache_id: int, first: int, count: int) -> tuple[int, int, int, Any] | None:
        """A new chunk from row ``first`` holding at least ``count`` rows, or None (the
        rows a budget allows are too few to pay, or a null comes first)."""
        rows = min(_CHUNK_BYTES // self._row_bytes, _CHUNK_BATCHES * count)
        self._chunk = None  # the old one goes, even if no new one comes
        if rows < _CHUNK_BATCHES_MIN * count:
            return None
        if self._lookup is None:
            self._lookup = _native.Lookup.open(self._handle)
        batch = self._lookup.stored_rows(cache_id, first, rows)
        got = batch.count
        if got < count:
            return None
        frame = _metadata_frame(batch, self.columns)
        self._row_bytes = max(1, frame.estimated_size() // got)
        chunk = self._chunk = (cache_id, first, first + got, frame)
        self._keep(chunk)
        return chunk


# Reserved for a batch: the latest batch's bytes a sample times this, plus the margin
# (trimmed to what the batch takes).
_GATHER_SLACK = 1.125
_GATHER_MARGIN = 64 << 10
# Staged batches (`_Gather._stage`): their memory holds the records whole (header, JSON
# and payload), whose bytes a sample vary less than payloads between batches.
_STAGE_SLACK = 1.03
# Batches staged ahead at once (the library's bound): read on two workers.
_STAGED_BATCHES = 2
# The reused memory of iter_batches(copy=True): a pool of this many batches' bytes (the
# consumer holds the previous batch while the next one is built, and sizes vary), at
# least the minimum, at most the maximum (larger batches take fresh memory each time).
# Batches under _POOL_BATCH_MIN_BYTES take fresh memory: the allocator hands back memory
# just freed (no page faults, and still in the CPU caches), while a ring's next region is
# cold; a fresh mapping per batch (and its page faults) is what larger batches avoid.
_POOL_BATCH_MIN_BYTES = 8 << 20
_POOL_BATCHES = 3
_POOL_MIN_BYTES = 8 << 20
_POOL_MAX_BYTES = 1 << 30


class _BatchMemory:
    """Where :meth:`CachedDataset.iter_batches` (``copy=True``) builds a batch's payloads:
    a region of a :class:`dataset_rt._buffers.Pool` (pages already faulted in, given back
    when the batch's ``data`` and every view of it are gone), or fresh memory owned by
    the array when the pool is full (a consumer that keeps batches), or the batch is
    under ``_POOL_BATCH_MIN_BYTES`` or too large for a pool. Bounded: a pool holds about
    ``_POOL_BATCHES`` of the largest batches asked for and never grows past
    ``_POOL_MAX_BYTES``. One per dataset (its iterators share it, also from several
    threads), so later epochs fault nothing in; freed with the dataset and the last
    batch built in it."""

    __slots__ = ("_pool", "per_sample")

    def __init__(self) -> None:
        self._pool: Any = None
        # Payload bytes a sample in the latest batch built here (-1: none yet): the next
        # iterator's first batch is sized from it too.
        self.per_sample = -1.0

    def _pool_for(self, nbytes: int) -> Any:
        from dataset_rt import _buffers

        wanted = _POOL_BATCHES * _buffers.span(nbytes)
        pool = self._pool
        if pool is not None and pool.capacity >= wanted and pool.pid == os.getpid():
            return pool
        if wanted > _POOL_MAX_BYTES:
            return None
        capacity = max(wanted, _POOL_MIN_BYTES)
        if pool is not None:
            capacity = max(capacity, 2 * pool.capacity)  # records that grow: few re-makes
        capacity = _buffers.span(min(capacity, _POOL_MAX_BYTES))
        pool = self._pool = _buffers.Pool(capacity)
        return pool

    def take(self, nbytes: int) -> tuple[Any, Any]:
        """``(region, lease)``: a writable ``numpy.uint8`` array of ``nbytes``, and what
        :meth:`trim` needs (None for fresh memory)."""
        import numpy as np

        pool = self._pool_for(nbytes) if nbytes >= _POOL_BATCH_MIN_BYTES else None
        taken = None if pool is None else pool.take(nbytes)
        if taken is None:
            return np.empty(nbytes, dtype=np.uint8), None
        region, entry, start = taken
        return region, (pool, entry, start)

    @staticmethod
    def trim(region: Any, lease: Any, nbytes: int) -> Any:
        """``region[:nbytes]``, the rest of a pool region given back for the next batch."""
        if lease is not None:
            pool, entry, start = lease
            pool.trim(entry, start, nbytes)
        return region[:nbytes]


class _Gather:
    """The batches of ``iter_batches(copy=True)`` from one native iterator: each batch
    is one contiguous native batch (``drt_iter_next_batch_into``) whose payloads the
    library copies once, straight from its mappings or read buffers, into memory from
    :class:`_BatchMemory`, sized from the latest batch's bytes a sample
    (``_GATHER_SLACK``, ``_GATHER_MARGIN``; trimmed to what the batch takes). The first
    batch of a dataset, and a batch larger than foreseen, is copied out of the
    iterator's buffer instead (one more copy). After each batch, up to two next batches
    are staged (``drt_iter_stage_batch``, :meth:`_stage`): when they are ordered runs
    of small records in the page cache, workers read them straight into their memory
    while the caller works, and their calls copy nothing. The same samples, bytes and
    batch boundaries as contiguous native batches of the same size; a read error met
    after some samples of a batch is raised by the next call (natively)."""

    __slots__ = (
        "_frames",
        "_iterator",
        "_left",
        "_memory",
        "_per_sample",
        "_record_bytes",
        "_stageable",
        "_staged",
    )

    def __init__(
        self, iterator: _native.Iterator, frames: _StoredFrames, memory: _BatchMemory
    ) -> None:
        self._iterator = iterator
        self._frames = frames
        self._memory = memory
        # Payload bytes a sample in the latest batch (before the first one: the dataset's).
        self._per_sample = memory.per_sample
        self._left = iterator.window().count  # samples not yet handed out (at most)
        # Record bytes a sample of the latest staged batch (0: none staged yet), whether
        # to stage (until the library says a batch cannot be), and the memory and size
        # of the batches staged for the next calls, in order.
        self._record_bytes = 0.0
        self._stageable = True
        self._staged: list[tuple[Any, int]] = []

    def next(self, size: int) -> SampleBatch | None:
        """The next batch of up to ``size`` samples, None at the end of the window."""
        import numpy as np

        iterator, memory = self._iterator, self._memory
        region: Any = np.empty(0, dtype=np.uint8)
        lease: Any = None
        staged = self._staged
        if staged and staged[0][1] == size:
            region = staged.pop(0)[0]  # the library is reading this batch into it
        else:
            staged.clear()  # this call drops them
            if self._per_sample >= 0 and self._left > 0:
                region, lease = memory.take(
                    int(self._per_sample * min(size, self._left) * _GATHER_SLACK) + _GATHER_MARGIN
                )
        batch, placed = iterator.next_batch_into(size, _STORED, region)
        count = batch.count
        if count == 0:
            return None
        payloads, offsets, ids, samples = batch.arrays(False)
        total = int(offsets[count])
        if not placed:
            # The dataset's first batch (no estimate yet) or one larger than foreseen:
            # copied once more, out of the iterator's buffer.
            if lease is not None:
                memory.trim(region, lease, 0)
            del region
            region, lease = memory.take(total)
            region[:total] = payloads
        self._per_sample = memory.per_sample = total / count
        self._left -= count
        built = SampleBatch(
            memory.trim(region, lease, total),
            offsets,
            ids.copy(),
            samples.copy(),
            self._frames.frame(batch),
        )
        while len(self._staged) < _STAGED_BATCHES and self._stage(size):
            pass
        return built

    def _stage(self, size: int) -> bool:
        """Stages the batch after those staged (``drt_iter_stage_batch``) in new memory
        when it can be (an ordered read of small records in the page cache): a worker
        reads it straight into that memory while the caller works on this batch, and the
        call that reaches it copies nothing. Batches the pool of :class:`_BatchMemory`
        would hold are not staged (their memory would be taken early). Once the library
        answers that a batch cannot be staged (a shuffled read, large records, batches
        too small to be worth it), the iterator stops asking. Returns whether one was
        staged."""
        import numpy as np

        iterator = self._iterator
        count = min(size, self._left - size * len(self._staged))
        if count <= 0 or not self._stageable:
            return False
        if self._record_bytes > 0:
            nbytes = int(self._record_bytes * count * _STAGE_SLACK) + _GATHER_MARGIN
        else:
            nbytes = iterator.stage_batch(size, None)  # asks how much
            self._stageable = nbytes > 0
        if nbytes == 0 or nbytes >= _POOL_BATCH_MIN_BYTES:
            return False
        region = np.empty(nbytes, dtype=np.uint8)
        needed = iterator.stage_batch(size, region)
        if needed > nbytes and needed < _POOL_BATCH_MIN_BYTES:
            region = np.empty(needed, dtype=np.uint8)
            needed = iterator.stage_batch(size, region)
        if 0 < needed <= len(region):
            self._staged.append((region, size))
            self._record_bytes = needed / count
            return True
        self._record_bytes = 0.0
        return False


def _gathered_batch(batch: _native.Batch, frames: _StoredFrames) -> SampleBatch:
    """Any native batch as a :class:`SampleBatch` of owned arrays: the payloads copied
    once into a new ``numpy.uint8`` array (``drt_batch_copy_payloads``)."""
    import numpy as np

    lengths, cache_id, sample_id = batch.lengths_and_ids()
    offsets = np.zeros(len(lengths) + 1, dtype=np.uint64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    batch.copy_payloads(data)
    return SampleBatch(data, offsets, cache_id.copy(), sample_id.copy(), frames.frame(batch))


def _empty_batch(columns: list[tuple[str, int]]) -> SampleBatch:
    """A batch of no samples, with the types of a filled one."""
    import numpy as np
    import polars as pl
    import pyarrow as pa

    empty = {
        _native.Kind.INT: lambda: np.zeros(0, dtype=np.int64),
        _native.Kind.FLOAT: lambda: np.zeros(0, dtype=np.float64),
        _native.Kind.BOOL: lambda: np.zeros(0, dtype=bool),
        _native.Kind.STRING: lambda: pa.array([], type=pa.large_string()),
    }
    frame = pl.DataFrame({name: empty[_native.Kind(kind)]() for name, kind in columns})
    u64 = np.zeros(0, dtype=np.uint64)
    return SampleBatch(
        np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.uint64), u64, u64.copy(), frame
    )


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
