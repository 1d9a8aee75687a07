"""PyTorch adapters: ``CachedDataset.to_torch_iterable_dataset`` and
``CachedDataset.to_torch_dataloader`` (this module imports torch; ``import dataset_rt``
never does).

Native state belongs to the process that reads: every consumer (the training process
with ``num_workers=0``, or each DataLoader worker) opens its own reader from a snapshot
of the dataset (``dump_config``) on first use, whatever the start method; objects
crossing a process boundary carry only the recipe (paths, options, counts). Which stream
positions a consumer reads in a pass is plain arithmetic (``_loading``), read by the
native range iterator, so it never depends on timing, prefetch or how far another
consumer got; that is what makes ``state_dict()`` / ``load_state_dict()`` exact.

Two paths read those positions. The per-sample path (dataset-rt 0.4.8's) yields
``CachedSample`` records that torch batches and collates. The tensor path
(``batch_format="tensors"``) cuts the same positions into the same batches itself, builds
each from native batches as a ``TensorBatch`` (one buffer of tensors, in memory reused
once a batch is dropped; a worker's in its ring of shared memory, which the training
process maps) and hands torch built batches (its auto-batching off; workers hand over
several per item).
"""

from __future__ import annotations

import dataclasses
import fcntl
import mmap
import os
import pickle
import shutil
import tempfile
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from multiprocessing.reduction import DupFd, ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data._utils.pin_memory import pin_memory

from dataset_rt import _native
from dataset_rt._buffers import Pool, Releases
from dataset_rt._buffers import fit as _fit
from dataset_rt._buffers import span as _span
from dataset_rt.config import DatasetConfiguration
from dataset_rt.integrations import _loading as plan
from dataset_rt.integrations.loader_logging import loader_event as _event
from dataset_rt.records import CachedSample
from dataset_rt.runtime import DatasetRuntime

LOADER_STATE_FORMAT = "dataset_rt.loader_state/1"
ORDER_NAME = "partition-order.npy"

BATCH_FORMATS = ("samples", "tensors")

__all__ = [
    "DatasetRTDataLoader",
    "DatasetRTIterableDataset",
    "TensorBatch",
    "to_torch_dataloader",
    "to_torch_iterable_dataset",
]


# ------------------------------------------------------------------ snapshots and readers


class _Snapshot:
    """A directory holding ``dataset.json`` + ``metadata.arrow`` (and, for shuffled
    "split", the shared row order), owned by the process that made it: a temporary one
    is removed when its owner is garbage collected, never by a child process."""

    def __init__(self, work_dir: str | os.PathLike[str] | None) -> None:
        if work_dir is not None and not Path(work_dir).is_dir():
            raise ValueError(f"work_dir {os.fspath(work_dir)!r} is not an existing directory")
        self.directory = Path(tempfile.mkdtemp(prefix="dataset-rt-", dir=work_dir))
        owner = os.getpid()
        self._finalizer = weakref.finalize(self, _remove_owned, self.directory, owner)
        if work_dir is not None:
            # A caller-chosen work_dir keeps its export (as the reference does).
            self._finalizer.detach()

    def discard(self) -> None:
        self._finalizer()


def _remove_owned(directory: Path, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass(frozen=True)
class _Recipe:
    """What a consumer needs to open its own reader: picklable, no handles."""

    config_path: str
    native_threads: int
    shuffle: bool
    seed: int
    # Install the snapshot's table (rows ``selection``) instead of the caches' own table.
    use_table: bool
    order_path: str | None = None
    # (st_dev, st_ino) of each cache directory the snapshot was taken from (None: a URL).
    cache_dirs: tuple[tuple[int, int] | None, ...] = ()


def _check_cache_dirs(dataset: Any, identities: tuple[tuple[int, int] | None, ...]) -> None:
    """Raises ValueError, as the dataset itself would, when ``dataset`` (a reader opened
    from a snapshot) opened a cache directory other than the one the snapshot was taken
    from (rebuilt with ``on_stale="rebuild"``): it would pair the snapshot's table with
    other bytes."""
    for path, opened, identity in zip(dataset.cache_paths, dataset._dir_identities, identities):
        if opened != identity:
            raise _native.replaced_error(path)


def _open_reader(recipe: _Recipe, offset: int = 0, population: int = 0) -> Any:
    """A ``CachedDataset`` for this process from the snapshot: the caches with the
    snapshot's reader options and ``recipe``'s shuffle and seed; with ``use_table``, the
    active table is the snapshot's rows ``offset .. offset + population`` (cyclic; in the
    shared shuffled row order when ``order_path`` is set; all rows when ``population``
    is 0), which switches shuffled reading to weighted draws as in dataset-rt 0.4.8."""
    import pyarrow as pa

    config_file = Path(recipe.config_path)
    config = DatasetConfiguration.model_validate_json(config_file.read_bytes())
    reader_config = config.reader_config.model_copy(
        update={"shuffle": recipe.shuffle, "seed": recipe.seed}
    )
    runtime = DatasetRuntime(num_workers=recipe.native_threads)
    dataset = runtime.cached_dataset(list(config.cache_paths), reader_config=reader_config)
    _check_cache_dirs(dataset, recipe.cache_dirs)
    if recipe.use_table:
        with pa.memory_map(str(config_file.parent / config.metadata_file), "r") as source:
            table = pa.ipc.open_file(source).read_all()
        count = table.num_rows
        if population and (recipe.order_path is not None or offset or population != count):
            if recipe.order_path is not None:
                order = np.load(recipe.order_path, mmap_mode="r", allow_pickle=False)
                positions = (np.arange(population, dtype=np.uint64) + offset % count) % count
                indices = np.asarray(order[positions])
            else:
                indices = (np.arange(population, dtype=np.uint64) + offset % count) % count
            table = table.take(pa.array(indices.astype(np.int64)))
        dataset._set_arrow_table(table)
    return dataset


class _LocalReader:
    """The reader of one consumer, opened lazily in the process that reads."""

    def __init__(self) -> None:
        self.pid = -1
        self.dataset: Any = None

    def get(self, open_reader: Callable[[], Any]) -> Any:
        if self.pid != os.getpid():
            self.dataset = None  # inherited through fork: never reuse the parent's handles
            self.dataset = open_reader()
            self.pid = os.getpid()
        return self.dataset


def _worker_identity() -> tuple[int, int]:
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


# ------------------------------------------------------------------ to_torch_iterable_dataset


class _PassCounter:
    """Per-(worker count, worker) pass numbers kept in the snapshot directory, so a
    worker's k-th pass is the same whether workers persist or restart every epoch."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def next(self, workers: int, worker: int) -> int:
        path = os.path.join(self.directory, f"passes-{workers}-{worker}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.read(fd, 32)
            current = int(raw) if raw else 0
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, str(current + 1).encode())
            return current
        finally:
            os.close(fd)


class DatasetRTIterableDataset(IterableDataset):  # type: ignore[type-arg]
    """A sized ``IterableDataset`` over a ``CachedDataset``'s stream.

    In the training process, ``iter()`` is ``iter(dataset)`` (each pass continues the
    dataset's stream). In DataLoader worker ``w`` of ``W``, pass ``k`` reads part ``w``
    of window ``k`` (contiguous spans, the first ones one sample longer) of the stream as
    it stood when this object was made: windows of ``len(dataset)`` positions from the
    dataset's position then, so the workers of one epoch together read exactly the
    window one ``iter(dataset)`` would, whether workers persist or restart. Workers read
    from their own readers; the dataset's own position does not move.
    """

    def __init__(self, dataset: Any) -> None:
        self._dataset = dataset
        self._start, _ = dataset._stream()
        self._window = len(dataset)
        self._snapshot = _Snapshot(None)
        config_path = dataset.dump_config(self._snapshot.directory)
        self._recipe = _Recipe(
            config_path=str(config_path),
            native_threads=dataset._runtime.num_workers,
            shuffle=bool(dataset._reader_config.shuffle),
            seed=int(dataset._reader_config.seed),
            use_table=dataset._custom_table,
            cache_dirs=dataset._dir_identities,
        )
        self._reader = _LocalReader()

    def __reduce__(self) -> Any:
        return _restore_iterable, (self._recipe, self._start, self._window)

    def __len__(self) -> int:
        return len(self._dataset) if self._dataset is not None else self._window

    def __iter__(self) -> Iterator[CachedSample]:
        info = get_worker_info()
        if info is None and self._dataset is not None:
            return iter(self._dataset)
        worker, workers = _worker_identity()
        counter = _PassCounter(str(Path(self._recipe.config_path).parent))
        k = counter.next(workers, worker)
        offset, length = plan.span(self._window, workers, worker)
        start = (self._start + k * self._window + offset) % 2**64
        dataset = self._reader.get(lambda: _open_reader(self._recipe))
        return dataset._iter_range(start, length)


def _restore_iterable(recipe: _Recipe, start: int, window: int) -> DatasetRTIterableDataset:
    self = DatasetRTIterableDataset.__new__(DatasetRTIterableDataset)
    self._dataset = None
    self._start = start
    self._window = window
    self._recipe = recipe
    self._reader = _LocalReader()
    return self


def to_torch_iterable_dataset(dataset: Any) -> DatasetRTIterableDataset:
    """See ``CachedDataset.to_torch_iterable_dataset``."""
    return DatasetRTIterableDataset(dataset)


# ------------------------------------------------------------------ tensor batches

# Kinds of values in a batch's buffer (metadata columns by numpy kind; "u" the payload
# bytes): kind -> (torch dtype, numpy dtype, bytes per value).
_DTYPES = {
    "i": (torch.int64, np.dtype(np.int64), 8),
    "f": (torch.float64, np.dtype(np.float64), 8),
    "b": (torch.bool, np.dtype(np.bool_), 1),
    "u": (torch.uint8, np.dtype(np.uint8), 1),
}


class TensorBatch:
    """A batch of the loader's ``batch_format="tensors"`` path: ``len(batch)`` samples
    built from one native batch, without per-sample Python objects.

    - ``data``: the payloads, a ``uint8`` tensor: ``[batch, length]`` when every payload
      of this batch has the same length, else 1-D, all payloads back to back; sample
      ``i``'s bytes are ``data.flatten()[offsets[i]:offsets[i + 1]]`` either way.
    - ``offsets``: ``int64``, ``len(batch) + 1`` entries, starting at 0.
    - ``cache_id``, ``sample_id``: ``int64`` tensors (the per-sample path's collated
      values).
    - ``metadata``: column name to an ``int64``, ``float64`` or ``bool`` tensor, or a list
      of ``str`` for string columns, in the caches' column order.

    Every tensor lies in the memory of one ``uint8`` tensor, ``buffer`` (in host memory
    the loader filled, the fields are made from numpy views of it, which costs a
    fraction of torch's slicing; after ``pin_memory()`` or ``to(device)``, they are
    views of the new ``buffer``), so ``pin_memory()`` pins it once and ``to(device)``
    copies it once. ``buffer`` is memory the loader
    reuses once the batch and every view of it are dropped (keeping batches is safe: the
    loader then takes fresh memory). A DataLoader worker builds batches in its ring of
    shared memory, which the training process maps, so a batch reaches it without a
    copy (when the ring is full, it is shared as torch shares a tensor). A batch is sent
    between processes as (buffer, layout, strings): attributes replaced on it or keys
    added to ``metadata`` are not carried; a ``batch_transform_fn`` returns its own
    structure instead.
    """

    __slots__ = (
        "_layout",
        "_raw",
        "_ring",
        "_strings",
        "buffer",
        "cache_id",
        "data",
        "metadata",
        "offsets",
        "sample_id",
    )

    def __init__(
        self, buffer: torch.Tensor, layout: tuple[Any, ...], strings: dict[str, list[str]]
    ) -> None:
        self.buffer = buffer
        self._layout = layout
        self._strings = strings
        self._raw: np.ndarray | None = None
        self._ring: tuple[Any, ...] | None = None

    @classmethod
    def _host(
        cls, raw: np.ndarray, layout: tuple[Any, ...], strings: dict[str, list[str]]
    ) -> TensorBatch:
        """A batch over host memory the loader filled, ``raw`` (numpy): its fields are
        made from numpy views (``torch.from_numpy`` costs a fraction of a tensor slice
        and view), ``buffer`` on first use."""
        batch = cls.__new__(cls)
        batch._layout = layout
        batch._strings = strings
        batch._raw = raw
        batch._ring = None
        return batch

    def __getattr__(self, name: str) -> Any:
        # The fields are views of ``buffer`` made on first use (a view costs about as
        # much as a batch of small records takes to copy): of the numpy array ``raw``
        # while the batch is in host memory the loader filled (``torch.from_numpy`` of a
        # numpy view costs a fraction of a tensor slice and view), else of ``buffer``.
        count, width, head, nbytes, order, numeric = self._layout
        raw = self._raw
        if raw is not None:
            if name == "buffer":
                value = torch.from_numpy(raw)
                self.buffer = value
                return value

            def view(start: int, stop: int, kind: str) -> torch.Tensor:
                return torch.from_numpy(raw[start:stop].view(_DTYPES[kind][1]))

        else:
            buffer = self.buffer

            def view(start: int, stop: int, kind: str) -> torch.Tensor:
                return buffer[start:stop].view(_DTYPES[kind][0])

        ids = 8 * (count + 1)
        value: Any
        if name == "data":
            value = view(head, head + nbytes, "u")
            if width >= 0:
                value = value.view(count, width)
        elif name == "offsets":
            value = view(0, ids, "i")
        elif name == "cache_id":
            value = view(ids, ids + 8 * count, "i")
        elif name == "sample_id":
            value = view(ids + 8 * count, ids + 16 * count, "i")
        elif name == "metadata":
            strings = self._strings
            value = {}
            for column in order:
                if column in strings:
                    value[column] = strings[column]
                else:
                    kind, position = numeric[column]
                    value[column] = view(position, position + _DTYPES[kind][2] * count, kind)
        else:
            raise AttributeError(f"'TensorBatch' object has no attribute {name!r}")
        setattr(self, name, value)
        return value

    def __reduce__(self) -> Any:
        if self._ring is not None:
            # In a worker's ring, which only its bundles pass on: share a copy.
            return TensorBatch, (self.buffer.clone(), self._layout, self._strings)
        return TensorBatch, (self.buffer, self._layout, self._strings)

    def __len__(self) -> int:
        return int(self._layout[0])

    def _nbytes(self) -> int:
        """The bytes of ``buffer``."""
        raw = self._raw
        return int(raw.nbytes) if raw is not None else int(self.buffer.numel())

    def __repr__(self) -> str:
        return (
            f"TensorBatch(len={len(self)}, data={tuple(self.data.shape)}, "
            f"metadata={list(self.metadata)}, device={self.buffer.device})"
        )

    def payload(self, index: int) -> bytes:
        """Sample ``index``'s payload as bytes (a copy; for inspection, not a loop)."""
        count, _, head, _, _, _ = self._layout
        if not -count <= index < count:
            raise IndexError(f"sample {index} is out of range for a batch of {count}")
        index %= count
        start, end = self.offsets[index : index + 2].tolist()
        return bytes(self.buffer[head + start : head + end].cpu().numpy())

    def pin_memory(self) -> TensorBatch:
        """This batch in page-locked memory: one ``pin_memory()`` of ``buffer`` (the
        DataLoader's ``pin_memory=True`` calls it once per batch)."""
        return TensorBatch(self.buffer.pin_memory(), self._layout, self._strings)

    def is_pinned(self) -> bool:
        """Whether ``buffer`` (so every field) is in page-locked memory."""
        return bool(self.buffer.is_pinned())

    def to(self, device: Any, non_blocking: bool = False) -> TensorBatch:
        """This batch on ``device``: one copy of ``buffer`` (asynchronous from pinned
        memory with ``non_blocking=True``); every field is a view of the copy."""
        buffer = self.buffer.to(device, non_blocking=non_blocking)
        return TensorBatch(buffer, self._layout, self._strings)


def _pass_batch(batch: Any) -> Any:
    """The loader's collate on the tensor path: batches arrive built."""
    return batch


def _padded(nbytes: int) -> int:
    return (nbytes + 7) & ~7


def _allocate(nbytes: int, shared: bool) -> torch.Tensor:
    """A fresh ``uint8`` tensor of ``nbytes``; in shared memory when ``shared`` (a
    DataLoader worker's result then reaches the training process the way torch shares
    tensors, without another copy)."""
    if not shared:
        return torch.empty(nbytes, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


# Batch memory. A batch is built with one copy out of the native batch into memory that
# is reused: a fresh 16 MiB tensor per batch costs its page faults every time, and a
# worker's batch shared the way torch shares tensors costs a file descriptor handshake
# (about a millisecond on a small VM). Reused memory is a ring (one per process that
# builds batches) whose space is released in order once every view of a batch is gone;
# the ring never waits for the caller: a batch that does not fit now (the caller keeps
# many) gets fresh memory instead. A DataLoader worker's ring is an anonymous shared file
# (memfd: no name, so nothing is left behind whoever dies) that the training process maps
# once (its descriptor passed as torch passes one) and then only makes views of. The
# ring arithmetic, the in-order releases and the process-local pool are
# dataset_rt._buffers' (which iter_batches uses too).
_RING_HEADER = 64  # u64 at 0: bytes the receiver released; u64 at 8: its mapped token
_RING_MIN_BYTES = 16 << 20
_POOL_MIN_BYTES = 8 << 20
# Smaller batches of a process's own take fresh memory: the allocator hands back what the
# previous batch freed (no page faults, still in the CPU caches; a ring's next region is
# cold), about five times faster for a batch of 512 B records.
_POOL_BATCH_MIN_BYTES = 1 << 20
# A worker hands torch several batches per item: torch's per-item round trip between
# processes (queue feeder threads woken on both sides, the GIL handed over, a profiler
# range) costs more CPU than building a batch of small records, on cores the workers
# need. Bundles of 32 batches of 512 B records (4.5 MB) instead of 16 took 10-25% less
# CPU per batch over all processes (2 workers, 2 cores); once building a batch cost less
# (round 8), up to 64 batches (51 of 512 B records, by the byte cap) instead of 32 took
# 4-9% less again (a bundle costs the two sides about 200 us), for a ring 1.6 times as
# large (63 MiB a worker for 512 B records, batch 256); 128 cost more in round 7.
_BUNDLE_BYTES = 8 << 20
_BUNDLE_MAX = 64
_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


def _bundle_len(nbytes: int) -> int:
    """Batches per worker item for batches of ``nbytes``."""
    return max(1, min(_BUNDLE_MAX, _BUNDLE_BYTES // max(1, nbytes)))


_POOL: Pool | None = None


def _pool_for(nbytes: int) -> Pool:
    """This process's pool, with room for a few batches of ``nbytes``."""
    global _POOL
    if _POOL is None or _POOL.pid != os.getpid() or 4 * nbytes > _POOL.capacity:
        _POOL = Pool(max(_POOL_MIN_BYTES, 4 * _span(nbytes + nbytes // 4)))
    return _POOL


def _anonymous_file(size: int) -> int:
    """A descriptor of an unnamed shared file of ``size`` bytes."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("dataset_rt-batches", os.MFD_CLOEXEC)
    else:  # no memfd: a file unlinked at once (only a kill in between leaves it)
        fd, path = tempfile.mkstemp(prefix="dataset_rt-batches-", dir=_SHM_DIR)
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Ring:
    """A DataLoader worker's ring, written by the worker, read (mapped) by the training
    process, which releases space in order by advancing the header's counter."""

    def __init__(self, capacity: int) -> None:
        fd = _anonymous_file(_RING_HEADER + capacity)
        try:
            self._map = mmap.mmap(fd, _RING_HEADER + capacity)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        weakref.finalize(self, os.close, fd)
        self.pid = os.getpid()
        self.capacity = capacity
        self.token = int.from_bytes(os.urandom(8), "little") | 1
        self.produced = 0
        self.checked: tuple[int, int] | None = None  # (nbytes, prefetch) known to fit
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        self.header = self.array[:16].view(np.uint64)

    def reserve(self, nbytes: int) -> int | None:
        span = _span(nbytes)
        start = _fit(self.produced, int(self.header[0]), self.capacity, span)
        if start is not None:
            self.produced = start + span
        return start

    def region(self, start: int, nbytes: int) -> np.ndarray:
        at = _RING_HEADER + start % self.capacity
        return self.array[at : at + nbytes]

    def handoff(self) -> Any:
        """What the receiver needs to map this ring: None once it has (it writes the
        token into the header), else the descriptor, passed as torch passes one."""
        if int(self.header[1]) == self.token:
            return None
        return DupFd(self.fd)


_RING: _Ring | None = None


def _forget_ring() -> None:
    """In a forked child: the parent's ring is not this process's to write."""
    global _RING
    _RING = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_ring)


def _worker_ring(nbytes: int, prefetch: int) -> _Ring:
    """This worker process's ring, with room for the items torch prefetches and those
    the training process holds, of batches of ``nbytes``."""
    global _RING
    ring = _RING
    if ring is not None and ring.checked == (nbytes, prefetch):
        # The size the latest batch asked for (every batch of fixed-size records): known
        # to fit, without the sizing arithmetic and getpid (~5 us a batch here).
        return ring
    batches = (prefetch + 4) * _bundle_len(nbytes)
    if ring is None or ring.pid != os.getpid() or batches * _span(nbytes) > ring.capacity:
        # (A quarter more: a batch reserves a little more than the latest one took.)
        ring = _RING = _Ring(max(_RING_MIN_BYTES, batches * _span(nbytes + nbytes // 4)))
    ring.checked = (nbytes, prefetch)
    return ring


class _Mapped:
    """The training process's mapping of one worker's ring."""

    def __init__(self, fd: int, capacity: int, token: int) -> None:
        self.map = mmap.mmap(fd, _RING_HEADER + capacity)
        self.token = token
        self.capacity = capacity
        self.array = np.frombuffer(self.map, dtype=np.uint8)
        self.header = self.array[:16].view(np.uint64)
        self.releases = Releases(self._publish)
        self.header[1] = token

    def _publish(self, end: int) -> None:
        self.header[0] = end

    def view(self, start: int, nbytes: int) -> np.ndarray:
        at = _RING_HEADER + start % self.capacity
        region, _ = self.releases.view(self.array, at, nbytes, start + _span(nbytes))
        return region


_MAPPED: dict[int, _Mapped] = {}  # writer pid -> its current ring


def _mapped_ring(pid: int, token: int, capacity: int, handoff: Any) -> _Mapped:
    """The receiver's mapping of worker ``pid``'s ring ``token``, mapped from
    ``handoff`` the first time. A mapping stays valid while views of it exist, after
    the worker is gone or has a new ring."""
    mapped = _MAPPED.get(pid)
    if handoff is not None:
        fd = handoff.detach()
        try:
            if mapped is None or mapped.token != token:
                _forget_dead_rings()
                mapped = _MAPPED[pid] = _Mapped(fd, capacity, token)
        finally:
            os.close(fd)
    if mapped is None or mapped.token != token:
        raise RuntimeError(f"DataLoader worker {pid} sent a batch from a ring never passed")
    return mapped


def _forget_dead_rings() -> None:
    """Drop the mappings of workers that have exited (each stays mapped until the last
    view of it is gone)."""
    for writer in [w for w in _MAPPED if not _alive(w)]:
        del _MAPPED[writer]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Bundle:
    """Several consecutive items of one DataLoader worker, sent to the training process
    as one (which flattens them back in the order torch would have yielded them). Its
    ring batches travel as positions in the worker's ring."""

    __slots__ = ("items", "worker")

    def __init__(self, worker: int, items: list[Any]) -> None:
        self.worker = worker
        self.items = items

    def __reduce__(self) -> Any:
        ring = None
        items: list[Any] = []
        for item in self.items:
            place = item._ring if isinstance(item, TensorBatch) else None
            if place is not None and ring is None:
                ring = place[2]
            if place is not None and place[2] is ring:
                items.append((place[0], place[1], item._layout, item._strings))
            else:
                items.append(item)  # (a batch of a replaced ring shares a copy)
        info = None
        if ring is not None:
            info = (ring.pid, ring.token, ring.capacity, ring.handoff())
        return _restore_bundle, (self.worker, info, items)

    def pin_memory(self, *args: Any) -> _Bundle:
        """Every item pinned as the DataLoader pins a batch."""
        return _Bundle(self.worker, [pin_memory(item) for item in self.items])


def _restore_bundle(worker: int, info: tuple[Any, ...] | None, items: list[Any]) -> _Bundle:
    """Unpickling a bundle in the training process: ring batches become views of the
    worker's ring (no copy). Consecutive ones (one after the other in the ring, the
    usual case) are views of one region, whose space is released once all of them are
    dropped: one release to track per bundle, not per batch."""
    restored = list(items)
    if info is None:
        return _Bundle(worker, restored)
    mapped = _mapped_ring(*info)
    capacity = mapped.capacity
    run: list[int] = []  # indices of the current run of consecutive ring batches
    run_start = run_end = -1
    for index, item in enumerate(items):
        if type(item) is not tuple:
            continue
        start, nbytes = item[0], item[1]
        if start != run_end or start // capacity != run_start // capacity:
            _restore_run(mapped, restored, run, run_start, run_end)
            run = []
            run_start = start
        run.append(index)
        run_end = start + _span(nbytes)
    _restore_run(mapped, restored, run, run_start, run_end)
    return _Bundle(worker, restored)


def _restore_run(mapped: _Mapped, items: list[Any], run: list[int], start: int, end: int) -> None:
    """Replace ``items[i]`` for ``i`` in ``run`` (ring batches ``(start, nbytes, layout,
    strings)`` from ring position ``start`` to ``end``, one after the other) by
    ``TensorBatch`` es over one region of the ring."""
    if not run:
        return
    region = mapped.view(start, end - start)
    for index in run:
        at, nbytes, layout, strings = items[index]
        at -= start
        items[index] = TensorBatch._host(region[at : at + nbytes], layout, strings)


def _bundles(
    batches: Iterator[TensorBatch],
    worker: int,
    transform: Callable[[TensorBatch], Any] | None,
) -> Iterator[_Bundle]:
    """A worker's batches (``transform`` applied) grouped into bundles of
    ``_bundle_len`` of the first batch's size (the last one shorter)."""
    group: list[Any] = []
    limit = 0
    for batch in batches:
        if not limit:
            limit = _bundle_len(batch._nbytes())
        group.append(batch if transform is None else transform(batch))
        if len(group) == limit:
            yield _Bundle(worker, group)
            group = []
    if group:
        yield _Bundle(worker, group)


def _single_process(iterator: Any) -> Iterator[Any]:
    """The items torch's single-process iterator ``iterator`` yields on the tensor path
    (batches arrive built, collate passes them through), taken straight from the dataset
    iterator it opened and pinned as it would pin them: torch's per-item steps (a
    profiler range, an index drawn from a sampler, a fetch) cost about as much as
    building a batch of small records. Falls back to ``iterator`` itself if this torch
    keeps those parts elsewhere."""
    source = getattr(getattr(iterator, "_dataset_fetcher", None), "dataset_iter", None)
    pin = getattr(iterator, "_pin_memory", None)
    if source is None or pin is None:
        return iterator
    if pin:
        device = getattr(iterator, "_pin_memory_device", None)
        return (pin_memory(batch, device) for batch in source)
    return source


def _worker_items(iterator: Any) -> Iterator[Any]:
    """The items torch's multi-process iterator ``iterator`` yields (the workers'
    bundles), taken with its ``_next_data``, as ``_single_process`` takes the items of
    the single-process iterator: torch's ``__next__`` adds a profiler range (two
    dispatcher calls) and bookkeeping to each item, which only its length warning reads
    (the loader's own plan says how many bundles come). Falls back to ``iterator``
    itself if this torch keeps those parts elsewhere."""
    next_data = getattr(iterator, "_next_data", None)
    if next_data is None or getattr(iterator, "_sampler_iter", None) is None:
        return iterator
    return _drain(next_data)


def _drain(next_data: Callable[[], Any]) -> Iterator[Any]:
    """``next_data()`` until it raises ``StopIteration``."""
    try:
        while True:
            yield next_data()
    except StopIteration:
        return


def _unbundle(bundles: Iterator[Any], counts: list[int]) -> Iterator[Any]:
    """The batches of ``bundles`` (workers ``0 .. len(counts)`` with ``counts[w]``
    batches each) in the order torch yields one item per batch: worker 0, 1, ... in a
    cycle, skipping workers that have run out."""
    pending: list[deque[Any]] = [deque() for _ in counts]
    try:
        for round_ in range(max(counts, default=0)):
            for worker, count in enumerate(counts):
                if round_ >= count:
                    continue
                queue = pending[worker]
                while not queue:
                    bundle = next(bundles, None)
                    if bundle is None:
                        raise RuntimeError(f"DataLoader worker {worker} ended before its batches")
                    pending[bundle.worker].extend(bundle.items)
                    bundle.items = []
                yield queue.popleft()
        for bundle in bundles:
            if bundle.items:
                raise RuntimeError(
                    f"DataLoader worker {bundle.worker} sent more batches than planned"
                )
    finally:
        # Also after an early break: closing ``bundles`` lets go of torch's iterator,
        # which stops workers that do not persist; their rings are then dropped here
        # (each stays mapped while views of it exist).
        close = getattr(bundles, "close", None)
        if close is not None:
            close()
        pending.clear()
        _forget_dead_rings()


class _Space:
    """Memory reserved for one batch (see ``_reserve``): ``raw`` (numpy), ``nbytes``
    long, and ``buffer``, a tensor over it when it is torch's shared memory (else None:
    a batch makes its tensors from ``raw``); ``place`` is its ring position in a
    worker."""

    __slots__ = ("_entry", "_owner", "buffer", "place", "raw", "start")

    def __init__(self, raw: np.ndarray, buffer: torch.Tensor | None = None) -> None:
        self.raw = raw
        self.buffer = buffer
        self.place: tuple[int, int, _Ring] | None = None
        self._owner: Any = None
        self._entry: list[Any] | None = None
        self.start = 0

    def trim(self, nbytes: int) -> None:
        """Keep only the first ``nbytes`` (the reservation was the latest)."""
        self.raw = self.raw[:nbytes]
        if self.buffer is not None:
            self.buffer = self.buffer[:nbytes]
        end = self.start + _span(nbytes)
        if isinstance(self._owner, _Ring):
            self._owner.produced = end
            self.place = (self.start, nbytes, self._owner)
        elif isinstance(self._owner, Pool):
            self._owner.trim(self._entry, self.start, nbytes)  # type: ignore[arg-type]

    def batch(self, layout: tuple[Any, ...], strings: dict[str, list[str]]) -> TensorBatch:
        """The ``TensorBatch`` of this space, filled as ``layout`` says."""
        if self.buffer is not None:
            batch = TensorBatch(self.buffer, layout, strings)
        else:
            batch = TensorBatch._host(self.raw, layout, strings)
        batch._ring = self.place
        return batch


def _reserve(nbytes: int, sink: str, expected: int = 0) -> _Space:
    """``nbytes`` for a batch: ``sink`` ``"ring"`` (this worker's ring), ``"pool"`` (this
    process's pool, from ``_POOL_BATCH_MIN_BYTES``), ``"shared"`` (torch shared memory),
    falling back to fresh memory (shared unless ``"pool"``) when the ring or pool is
    full. ``expected``: the bytes the batch is expected to keep (the rest is trimmed),
    which size a ring (``nbytes`` when 0)."""
    if sink == "ring":
        ring = _worker_ring(expected or nbytes, _PREFETCH)
        start = ring.reserve(nbytes)
        if start is not None:
            space = _Space(ring.region(start, nbytes))
            space.place = (start, nbytes, ring)
            space._owner, space.start = ring, start
            return space
    elif sink == "pool":
        if nbytes >= _POOL_BATCH_MIN_BYTES:
            pool = _pool_for(nbytes)
            taken = pool.take(nbytes)
            if taken is not None:
                raw, entry, start = taken
                space = _Space(raw)
                space._owner, space._entry, space.start = pool, entry, start
                return space
        return _Space(np.empty(nbytes, dtype=np.uint8))
    buffer = _allocate(nbytes, True)
    return _Space(buffer.numpy(), buffer)


# Layouts kept per cache (by count and schema, or count and width): a loader meets few.
_CACHED_LAYOUTS = 64
# Batch layouts by (count, schema): most batches of a pass have the same.
_HEADERS: dict[tuple[int, tuple[tuple[str, Any], ...]], tuple[int, dict[str, Any]]] = {}


def _header(count: int, schema: list[tuple[str, Any]]) -> tuple[int, dict[str, tuple[str, int]]]:
    """Where the payloads start in a batch of ``count`` samples of ``schema`` (column name,
    numpy dtype or None for strings), and where each numeric column is (shared: not to
    be changed)."""
    key = (count, tuple(schema))
    known = _HEADERS.get(key)
    if known is not None:
        return known
    position = 8 * (count + 1) + 16 * count
    numeric: dict[str, tuple[str, int]] = {}
    for name, dtype in schema:
        if dtype is not None:
            numeric[name] = (dtype.kind, position)
            position += _padded(dtype.itemsize * count)
    if len(_HEADERS) >= _CACHED_LAYOUTS:
        _HEADERS.clear()
    _HEADERS[key] = (position, numeric)
    return position, numeric


# Metadata kinds of the native batch -> numpy dtype of the column (None: strings).
_KIND_DTYPES = {
    int(_native.Kind.INT): np.dtype(np.int64),
    int(_native.Kind.FLOAT): np.dtype(np.float64),
    int(_native.Kind.BOOL): np.dtype(np.bool_),
    int(_native.Kind.STRING): None,
}


# Reserved for a batch whose payloads the native reader writes straight into it: the
# bytes the latest batch's bytes a sample foresee times this, plus this (trimmed to what
# it takes).
_SLACK = 1.125
_MARGIN = 64 << 10
# Contiguous native batches (payloads back to back), metadata from metadata.arrow as
# every batch path takes it.
_CONTIGUOUS = int(_native.BatchFlag.CONTIGUOUS) | int(_native.BatchFlag.STORED_METADATA)
_NOWHERE = np.empty(0, dtype=np.uint8)  # no destination: payloads stay in the reader
# The string columns of a batch without any: one object (never changed), so a worker's
# bundle pickles it once.
_NO_STRINGS: dict[str, list[str]] = {}


class _Packer:
    """Builds the ``TensorBatch`` es of one native range iterator, one native call and a
    handful of C-level copies a batch: ``drt_iter_next_batch_into`` writes the payloads
    straight into the batch's buffer (from the shard mappings for small records whose
    pages are cached, else from the reader's read buffers: one copy), after the header's
    room; then the header is filled from the native batch (offsets, identities, numeric
    metadata; no intermediate arrays). The room is foreseen from the latest batch's
    payload bytes a sample (``per_sample``; ``_SLACK``, ``_MARGIN``) and trimmed to what
    the batch takes; without an estimate (the first batch of a reader's first pass) or
    when the payloads do not fit, they stay in the reader's buffer and are copied from
    there (one more copy). The reader's constants (columns, schema, where each section
    of a batch of ``count`` samples goes, the lengths of batches whose payloads all have
    one length) are worked out once."""

    __slots__ = ("_columns", "_even", "_heads", "_iterator", "_names", "_sink", "per_sample")

    def __init__(
        self,
        iterator: _native.Iterator,
        columns: list[tuple[str, int]],
        sink: str,
        per_sample: float = -1.0,
    ) -> None:
        self._iterator = iterator
        self._columns = [(i, name, int(kind)) for i, (name, kind) in enumerate(columns)]
        self._names = tuple(name for name, _ in columns)
        self._sink = sink
        # Payload bytes a sample in the latest batch (-1: none yet).
        self.per_sample = per_sample
        # count -> (head, numeric, [(index, kind, at, dtype) of numeric columns],
        #           [(index, name) of string columns])
        self._heads: dict[int, tuple[Any, ...]] = {}
        # (count, width) -> (lengths as bytes, offsets as uint64)
        self._even: dict[tuple[int, int], tuple[bytes, np.ndarray]] = {}

    def _head(self, count: int) -> tuple[Any, ...]:
        schema = [(name, _KIND_DTYPES[kind]) for _, name, kind in self._columns]
        head, numeric = _header(count, schema)
        # The 8-byte arrays the native batch copies into the header (cache ids, sample
        # ids, int and float columns: see ``Batch.words_into``); bool columns and
        # strings are converted here.
        places = [(-1, 8 * (count + 1)), (-2, 8 * (2 * count + 1))]
        bools = []
        strings = []
        for index, name, kind in self._columns:
            dtype = _KIND_DTYPES[kind]
            if dtype is None:
                strings.append((index, name))
            elif dtype.itemsize == 8:
                places.append((index, numeric[name][1]))
            else:
                at = numeric[name][1]
                bools.append((index, kind, slice(at, at + dtype.itemsize * count), dtype))
        if len(self._heads) >= _CACHED_LAYOUTS:
            self._heads.clear()
        known = self._heads[count] = (head, numeric, places, bools, strings)
        return known

    def width(self, lengths: bytes) -> int:
        """The payload length when every one of ``lengths`` (uint64 as bytes, at least
        one) is the same, else -1 (compared with cached even lengths: far cheaper than
        numpy's element-wise checks on a batch of small records)."""
        count, width = len(lengths) // 8, int.from_bytes(lengths[:8], "little")
        even = self._even.get((count, width)) or self._even_lengths(count, width)
        return width if lengths == even[0] else -1

    def _even_lengths(self, count: int, width: int) -> tuple[bytes, np.ndarray, tuple[Any, ...]]:
        """Cached for batches of ``count`` payloads of ``width`` bytes: their lengths
        (bytes), their offsets (uint64 as bytes, in a uint8 array) and their layout."""
        if len(self._even) >= _CACHED_LAYOUTS:
            self._even.clear()
        lengths = np.full(count, width, dtype=np.uint64).tobytes()
        offsets = (np.arange(count + 1, dtype=np.uint64) * np.uint64(width)).view(np.uint8)
        head, numeric = (self._heads.get(count) or self._head(count))[:2]
        # One layout object for every batch of this shape: a worker's bundle pickles it
        # once (the pickler's memo) and the training process unpickles it once.
        layout = (count, width, head, width * count, self._names, numeric)
        known = self._even[(count, width)] = (lengths, offsets, layout)
        return known

    def next(self, wanted: int) -> TensorBatch | None:
        """The ``TensorBatch`` of the next ``wanted`` (> 0) samples, None at the end of
        the range. A read error after some of them raises here (not a short batch)."""
        head, numeric, places, bools, strings = self._heads.get(wanted) or self._head(wanted)
        iterator = self._iterator
        space = None
        destination = _NOWHERE
        if self.per_sample >= 0:
            expected = head + int(self.per_sample * wanted)
            space = _reserve(int(expected * _SLACK) + _MARGIN, self._sink, expected)
            destination = space.raw[head:]
        batch, placed = iterator.next_batch_into(wanted, _CONTIGUOUS, destination)
        count = batch.count
        if count < wanted:
            if space is not None:
                space.trim(0)
            if not count:
                return None
            # Short before a read error, which the next call raises: raise it now, where
            # the per-sample path would, not after a short batch.
            iterator.next_batch_into(wanted, _CONTIGUOUS, _NOWHERE)
            raise RuntimeError("a native batch ended early without an error")
        # Identities and int/float columns go straight into the header (memmoves).
        lengths = batch.words_into(space.raw if placed else _NOWHERE, places if placed else ())
        width = self.width(lengths)
        if width >= 0:
            nbytes = width * count
        else:
            nbytes = int(np.frombuffer(lengths, dtype=np.uint64).sum())
        if placed:
            space.trim(head + nbytes)  # type: ignore[union-attr]
        else:
            if space is not None:
                space.trim(0)
            space = _reserve(head + nbytes, self._sink)
            batch.copy_payloads(space.raw[head : head + nbytes])
            batch.words_into(space.raw, places)
        self.per_sample = nbytes / count
        raw = space.raw
        if width >= 0:
            _, offsets, layout = self._even[(count, width)]
            raw[: 8 * (count + 1)] = offsets
        else:
            layout = (count, width, head, nbytes, self._names, numeric)
            words = raw[: 8 * (count + 1)].view(np.uint64)
            words[0] = 0
            np.add.accumulate(np.frombuffer(lengths, dtype=np.uint64), out=words[1:])
        for index, kind, at, dtype in bools:
            raw[at].view(dtype)[:] = batch.column_array(index, kind)
        if not strings:
            return space.batch(layout, _NO_STRINGS)
        values: dict[str, list[str]] = {}
        for index, name in strings:
            values[name] = batch.column_values(index, _native.Kind.STRING)
        return space.batch(layout, values)


_PREFETCH = 2  # torch's prefetch_factor in this worker (set when its iteration starts)
# Per reader (a CachedDataset of this process): payload bytes a sample of its latest
# tensor batch, so its next pass writes payloads in place from the first batch on.
_RECORD_SIZES: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def _tensor_batches(
    dataset: Any,
    start: int,
    count: int,
    block_len: int,
    block_stride: int,
    size: int,
    sink: str,
) -> Iterator[TensorBatch]:
    """The ``TensorBatch`` es of ``count`` stream positions (as ``_iter_range`` numbers
    them) cut into batches of ``size``, the last one shorter: the batches torch's
    auto-batching makes of the same samples (with ``drop_last`` the plans give every
    consumer whole batches, so there is no short one to drop). Each is one contiguous
    native batch whose payloads are written straight into the batch's buffer (see
    ``_Packer``), in ``sink`` (see ``_reserve``)."""
    if count <= 0:
        return
    with dataset._range_batches(start, count, block_len, block_stride) as reader:
        # Payload bytes a sample: this reader's previous pass's (recorded when a pass
        # ends or is abandoned), so a later pass's first batch is written in place too.
        packer = _Packer(reader._iterator, reader._columns, sink, _RECORD_SIZES.get(dataset, -1.0))
        remaining = count
        try:
            while remaining:
                wanted = min(size, remaining)
                batch = packer.next(wanted)
                if batch is None:
                    return
                yield batch
                remaining -= wanted
        finally:
            if packer.per_sample >= 0:
                _RECORD_SIZES[dataset] = packer.per_sample


# ------------------------------------------------------------------ to_torch_dataloader


@dataclass
class _Layout:
    """Who reads what: fixed at construction (and when a state with another seed is
    loaded). Picklable."""

    mode: plan.Partition
    rank: int
    world_size: int
    workers: int  # DataLoader worker processes (0: the training process reads)
    batch_size: int
    samples: int  # the requested global budget per pass
    drop_last: bool
    persistent: bool
    seed: int | None
    plans: list[plan.ConsumerPlan] = field(default_factory=list)  # reference modes
    batches_per_rank: int = 0  # global mode


@dataclass
class _Resume:
    """Where the next passes start. Reference modes: pass ``pass_index`` skips the first
    ``steps`` batches. Global mode: pass ``pass_index`` starts at stream position
    ``position`` with ``batches`` local batches; later passes follow it."""

    pass_index: int = 0
    steps: int = 0
    position: int = 0
    batches: int | None = None


class _LoaderDataset(IterableDataset):  # type: ignore[type-arg]
    """The dataset a ``DatasetRTDataLoader`` hands torch: ``len()`` is this rank's
    samples per pass; ``iter()`` in each consumer reads that consumer's positions for
    the current pass."""

    def __init__(
        self,
        layout: _Layout,
        recipe: _Recipe,
        transform: Callable[[CachedSample], Any] | None,
        verbose: bool,
        batch_format: str = "samples",
        batch_transform: Callable[[TensorBatch], Any] | None = None,
        prefetch: int | None = None,
    ) -> None:
        self.layout = layout
        self.recipe = recipe
        self.transform = transform
        self.verbose = verbose
        self.tensors = batch_format == "tensors"
        self.batch_transform = batch_transform
        self.prefetch = prefetch or 2
        self.resume = _Resume()
        self.pass_base = 0  # pass index of the consumer's first iter() in this process
        self._passes = 0
        self._readers: dict[int, _LocalReader] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_passes"] = 0
        state["_readers"] = {}
        return state

    def __len__(self) -> int:
        """Per-sample path: samples per pass (torch batches them). Tensor path: the
        batches torch would count for those samples (torch's DataLoader receives them
        built)."""
        samples = self.sample_count()
        if not self.tensors:
            return samples
        return _batch_count(samples, self.layout)

    def sample_count(self) -> int:
        """This rank's samples per pass."""
        layout = self.layout
        if layout.mode == "global":
            return layout.batches_per_rank * layout.batch_size
        return sum(p.sample_count for p in layout.plans)

    def begin(self, pass_index: int) -> None:
        """Called by the loader in the training process before each pass."""
        self.pass_base = pass_index
        self._passes = 0

    def _global_pass(self, pass_index: int) -> plan.GlobalPass:
        layout, resume = self.layout, self.resume
        per_pass = layout.batches_per_rank * layout.world_size * layout.batch_size
        first = resume.batches if resume.batches is not None else layout.batches_per_rank
        if pass_index == resume.pass_index:
            start, batches = resume.position, first
        else:
            later = pass_index - resume.pass_index - 1
            start = resume.position + first * layout.world_size * layout.batch_size
            start += later * per_pass
            batches = layout.batches_per_rank
        return plan.GlobalPass(start, batches, layout.batch_size, layout.world_size, layout.rank)

    def consumer(self, pass_index: int, worker: int) -> int:
        """The reference-mode consumer DataLoader worker ``worker`` serves in a pass.

        Normally its own. In a resumed pass the DataLoader starts its cycle at worker 0
        while the interrupted one would have continued with the consumer next in line,
        so workers serve the consumers rotated to start there."""
        layout, resume = self.layout, self.resume
        if layout.mode == "global" or pass_index != resume.pass_index or not resume.steps:
            return worker
        _, first = plan.round_robin(self._batch_counts(), resume.steps)
        return (first + worker) % max(1, layout.workers)

    def _batch_counts(self) -> list[int]:
        return [_batch_count(p.sample_count, self.layout) for p in self.layout.plans]

    def worker_batches(self, pass_index: int) -> list[int]:
        """The tensor path's batches of each DataLoader worker in pass ``pass_index``."""
        workers = max(1, self.layout.workers)
        counts = []
        for worker in range(workers):
            consumer = self.consumer(pass_index, worker)
            count = self.positions(pass_index, consumer, workers)[1]
            counts.append(-(-count // self.layout.batch_size))
        return counts

    def positions(self, pass_index: int, consumer: int, workers: int) -> tuple[int, int, int, int]:
        """``(start, count, block_len, block_stride)`` consumer ``consumer`` (a worker
        index) reads in pass ``pass_index`` (see ``drt_iter_open_range``)."""
        layout = self.layout
        if layout.mode == "global":
            return self._global_pass(pass_index).worker_range(consumer, workers)
        budget = layout.plans[consumer].sample_count
        continuing = layout.persistent or layout.workers == 0
        start = pass_index * budget if continuing else 0
        skip = 0
        if pass_index == self.resume.pass_index and self.resume.steps:
            taken, _ = plan.round_robin(self._batch_counts(), self.resume.steps)
            skip = min(taken[consumer] * layout.batch_size, budget)
        return start + skip, budget - skip, 0, 0

    def __iter__(self) -> Iterator[Any]:
        worker, workers = _worker_identity()
        layout = self.layout
        if workers != max(1, layout.workers):
            raise RuntimeError("DataLoader worker count differs from prepared partitions")
        pass_index = self.pass_base + self._passes
        self._passes += 1
        consumer = self.consumer(pass_index, worker)
        start, count, block_len, block_stride = self.positions(pass_index, consumer, workers)
        # Open the reader first (it logs reader_started), as dataset-rt 0.4.8 orders events.
        dataset = self._reader_for(consumer) if count else None
        if self.verbose:
            _event(
                "event=%s pid=%s rank=%s worker=%s pass=%s start=%s samples=%s",
                "reader_pass" if count else "reader_empty",
                os.getpid(),
                layout.rank,
                "main" if get_worker_info() is None else worker,
                pass_index,
                start,
                count,
            )
        if dataset is None:
            return iter(())
        if self.tensors:
            in_worker = get_worker_info() is not None
            if in_worker:
                global _PREFETCH
                _PREFETCH = self.prefetch
            # In a worker, a transform's result is shared the way torch shares tensors.
            sink = "pool" if not in_worker else "ring" if self.batch_transform is None else "shared"
            batches = _tensor_batches(
                dataset, start % 2**64, count, block_len, block_stride, layout.batch_size, sink
            )
            if in_worker:
                return _bundles(batches, worker, self.batch_transform)
            if self.batch_transform is None:
                return batches
            return map(self.batch_transform, batches)
        samples = dataset._iter_range(start % 2**64, count, block_len, block_stride)
        if self.transform is None:
            return samples
        return map(self.transform, samples)

    def _reader_for(self, consumer: int) -> Any:
        """This process's reader for ``consumer`` (global mode: one shared reader)."""
        key = 0 if self.layout.mode == "global" else consumer
        reader = self._readers.setdefault(key, _LocalReader())
        return reader.get(lambda: self._open(key))

    def prepare(self, worker: int) -> None:
        """Open this consumer's reader now (in a worker, before user code runs), so a
        cache that cannot be opened fails the worker at start."""
        if self.layout.mode == "global" or self.layout.plans[worker].sample_count:
            self._reader_for(worker)

    def _open(self, worker: int) -> Any:
        layout = self.layout
        if layout.mode == "global":
            return _open_reader(self.recipe)
        p = layout.plans[worker]
        recipe = _Recipe(
            config_path=self.recipe.config_path,
            native_threads=self.recipe.native_threads,
            shuffle=self.recipe.shuffle,
            seed=p.seed,
            use_table=True,
            order_path=self.recipe.order_path if p.partition_seed is not None else None,
            cache_dirs=self.recipe.cache_dirs,
        )
        if self.verbose:
            _event(
                "event=reader_started pid=%s rank=%s worker=%s seed=%s native_threads=%s "
                "samples=%s population=%s",
                os.getpid(),
                p.rank,
                "main" if get_worker_info() is None else worker,
                p.seed,
                recipe.native_threads,
                p.sample_count,
                p.population,
            )
        return _open_reader(recipe, p.offset, p.population)


def _batch_count(samples: int, layout: _Layout) -> int:
    if layout.drop_last:
        return samples // layout.batch_size
    return -(-samples // layout.batch_size)


class DatasetRTDataLoader(DataLoader):  # type: ignore[type-arg]
    """A ``torch.utils.data.DataLoader`` reading a dataset_rt snapshot, with
    ``state_dict()`` / ``load_state_dict()`` for exact mid-epoch resume.

    Each ``iter(loader)`` is one pass (epoch). The state records the pass and the
    batches this loader has yielded in it (counted where the training loop receives
    them, so batches that workers prefetched but nobody consumed are not counted);
    restoring it makes the next ``iter(loader)`` yield exactly the batches the
    interrupted pass had left, then later passes as if never interrupted.
    """

    _drt_dataset: _LoaderDataset
    _drt_identity: dict[str, Any]
    _drt_snapshot: _Snapshot

    def _drt_setup(self, identity: dict[str, Any], snapshot: _Snapshot) -> None:
        self._drt_dataset = self.dataset  # type: ignore[assignment]
        self._drt_identity = identity
        self._drt_snapshot = snapshot
        self._drt_next_pass = 0
        self._drt_current: int | None = None
        self._drt_steps = 0
        # The position a loaded state set, until the next pass starts from it.
        self._drt_loaded: dict[str, int] | None = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        pass_index = self._drt_next_pass
        self._drt_next_pass += 1
        self._drt_current = pass_index
        self._drt_loaded = None
        resume = self._drt_dataset.resume
        resumed = self._drt_dataset.layout.mode != "global" and pass_index == resume.pass_index
        # Reference modes count a resumed pass's batches from its start.
        self._drt_steps = resume.steps if resumed else 0
        self._drt_dataset.begin(pass_index)
        inner = super().__iter__()
        if self._drt_dataset.tensors and self.num_workers:
            # Workers send bundles of batches: flatten them in torch's order.
            counts = self._drt_dataset.worker_batches(pass_index)
            inner = _unbundle(_worker_items(inner), counts)
        elif self._drt_dataset.tensors:
            inner = _single_process(inner)
        return self._drt_count(inner, pass_index)

    def _drt_count(self, inner: Iterator[Any], pass_index: int) -> Iterator[Any]:
        # Through __dict__: DataLoader.__setattr__ (a Python function) checks every
        # assignment, which costs about as much per batch as a small record's batch.
        state = self.__dict__
        for batch in inner:
            if state["_drt_current"] == pass_index:
                state["_drt_steps"] += 1
            yield batch
        if self._drt_current == pass_index:
            self._drt_current = None

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: small (no sample lists), JSON-serializable, with the
        digest of the active table. In "global" mode it describes the whole job (every
        rank's describes the same position; only ``rank`` differs) and can be loaded with
        another world size. Right after ``load_state_dict`` (before the next pass starts)
        it is the loaded position."""
        layout = self._drt_dataset.layout
        pass_index, steps = self._drt_next_pass, 0
        if self._drt_current is not None and self._drt_steps < len(self):
            pass_index, steps = self._drt_current, self._drt_steps
        state: dict[str, Any] = {
            "format": LOADER_STATE_FORMAT,
            **self._drt_identity,
            "mode": layout.mode,
            "seed": layout.seed,
            "batch_size": layout.batch_size,
            "world_size": layout.world_size,
            "rank": layout.rank,
            "num_workers": layout.workers,
            "samples_per_epoch": layout.samples,
            "drop_last": layout.drop_last,
            "persistent_workers": layout.persistent,
            "pass": pass_index,
            "steps": steps,
        }
        if layout.mode == "global":
            if steps:
                current = self._drt_dataset._global_pass(pass_index)
                step = layout.world_size * layout.batch_size
                state["position"] = current.start + steps * step
                state["epoch_end"] = current.end
            else:
                state["position"] = self._drt_dataset._global_pass(pass_index).start
                state["epoch_end"] = state["position"]
        if self._drt_current is None and self._drt_loaded is not None:
            # Loaded and not started since: still exactly where the loaded state was.
            state.update(self._drt_loaded)
        return plan.as_plain(state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict()``, possibly of another process).

        Must match: the active table (digest), shuffle, mode and an explicit seed (a
        loader made with ``seed="random"`` adopts the saved seed). "split"/"replicate"
        also need the same world size, rank, workers, batch size, budget, drop_last and
        persistence (each consumer continues its own stream); "global" continues the
        job's stream with any world size, worker count or batch size. Raises
        ``ValueError`` naming the difference; on error nothing changes.
        """
        if not isinstance(state, Mapping) or state.get("format") != LOADER_STATE_FORMAT:
            raise ValueError(
                f"not a dataset_rt loader state (expected format {LOADER_STATE_FORMAT!r})"
            )
        dataset = self._drt_dataset
        layout = dataset.layout
        for key in ("table_digest", "shuffle"):
            if state.get(key) != self._drt_identity[key]:
                what = "a different active table" if key == "table_digest" else f"{key}"
                raise ValueError(
                    f"state was saved for {what} ({key}={state.get(key)!r}, this loader: "
                    f"{self._drt_identity[key]!r})"
                )
        if state.get("mode") != layout.mode:
            raise ValueError(
                f"state was saved in worker_partition={state.get('mode')!r} mode, this loader "
                f"uses {layout.mode!r}"
            )
        seed = state.get("seed")
        if seed != layout.seed and not self._drt_identity["random_seed"]:
            raise ValueError(
                f"state was saved with seed={seed!r}, this loader uses {layout.seed!r}"
            )
        if layout.mode != "global":
            for key, mine in (
                ("world_size", layout.world_size),
                ("rank", layout.rank),
                ("num_workers", layout.workers),
                ("batch_size", layout.batch_size),
                ("samples_per_epoch", layout.samples),
                ("drop_last", layout.drop_last),
                ("persistent_workers", layout.persistent),
            ):
                if state.get(key) != mine:
                    raise ValueError(
                        f"resuming worker_partition={layout.mode!r} needs the same {key} "
                        f"(state: {state.get(key)!r}, this loader: {mine!r}); "
                        "worker_partition='global' resumes with any world size"
                    )
        pass_index, steps = _nonneg(state, "pass"), _nonneg(state, "steps")
        resume = _Resume(pass_index, steps)
        if layout.mode == "global":
            position, end = _nonneg(state, "position"), _nonneg(state, "epoch_end")
            if end < position:
                raise ValueError("state['epoch_end'] is before state['position']")
            per_round = layout.world_size * layout.batch_size
            resume = _Resume(pass_index, 0, position, -(-(end - position) // per_round) or None)
        recipe = dataset.recipe
        if seed != layout.seed:
            row_count = self._drt_identity["row_count"]
            layout = _relayout(layout, seed, row_count)
            if layout.mode == "global":
                recipe = dataclasses.replace(recipe, seed=seed)
            elif recipe.order_path is not None:
                # Shuffled "split" slices a shared row order made from the seed.
                order_path = str(Path(recipe.order_path).with_name(f"partition-order.{seed}.npy"))
                np.save(order_path, _row_order(row_count, plan._require(seed)))
                recipe = dataclasses.replace(recipe, order_path=order_path)
        loaded = {"pass": pass_index, "steps": steps}
        if layout.mode == "global":
            loaded.update(position=state["position"], epoch_end=state["epoch_end"])
        self._drt_shutdown_workers()
        dataset.layout = layout
        dataset.recipe = recipe
        dataset.resume = resume
        dataset._readers = {}  # this process's readers were opened for the old plan
        self._drt_next_pass = pass_index
        self._drt_current = None
        self._drt_steps = 0
        self._drt_loaded = loaded

    def _drt_shutdown_workers(self) -> None:
        """Persistent workers hold the old plan: stop them; the next pass starts new ones."""
        iterator = getattr(self, "_iterator", None)
        if iterator is not None:
            shutdown = getattr(iterator, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            self._iterator = None


def _nonneg(state: Mapping[str, Any], key: str) -> int:
    value = state.get(key)
    if type(value) is not int or value < 0:
        raise ValueError(f"state[{key!r}] must be a nonnegative integer, got {value!r}")
    return value


def _relayout(layout: _Layout, seed: int | None, row_count: int) -> _Layout:
    """``layout`` for another base seed (a loaded state's)."""
    if layout.mode == "global":
        return _Layout(**{**layout.__dict__, "seed": seed})
    plans = plan.reference_plans(
        row_count=row_count,
        rank=layout.rank,
        world_size=layout.world_size,
        workers=layout.workers,
        batch_size=layout.batch_size,
        samples=layout.samples,
        partition=layout.mode,  # type: ignore[arg-type]
        shuffle=seed is not None,
        seed=seed,
        drop_last=layout.drop_last,
    )
    return _Layout(**{**layout.__dict__, "seed": seed, "plans": plans})


class _PickleSink:
    def write(self, data: bytes) -> int:
        return len(data)


def _check_picklable(
    transform: Callable[..., Any] | None, processes: int, name: str = "sample_transform_fn"
) -> None:
    if transform is None or processes == 0:
        return
    try:
        ForkingPickler(_PickleSink(), pickle.HIGHEST_PROTOCOL).dump(transform)
    except Exception as error:
        raise TypeError(f"{name} must be picklable for multiprocess loading") from error


def _check_batch_format(kwargs: Mapping[str, Any]) -> bool:
    """Validate the tensor-path options (extensions, checked after every option of
    dataset-rt 0.4.8); True for ``batch_format="tensors"``."""
    batch_format = kwargs["batch_format"]
    if not isinstance(batch_format, str) or batch_format not in BATCH_FORMATS:
        raise ValueError("batch_format must be 'samples' or 'tensors'")
    if batch_format == "samples":
        if kwargs["batch_transform_fn"] is not None:
            raise ValueError("batch_transform_fn requires batch_format='tensors'")
        return False
    for name, instead in (
        ("sample_transform_fn", "batch_transform_fn"),
        ("collate_fn", "batch_transform_fn"),
    ):
        if kwargs[name] is not None:
            raise ValueError(
                f"batch_format='tensors' builds whole batches without per-sample objects, "
                f"so it takes no {name}; use {instead} (it receives each TensorBatch)"
            )
    if kwargs["batch_transform_fn"] is not None and not callable(kwargs["batch_transform_fn"]):
        raise ValueError("batch_transform_fn must be callable or None")
    return True


@dataclass(frozen=True)
class _WorkerInit:
    """Opens the worker's reader before the caller's ``worker_init_fn`` runs."""

    callback: Callable[[int], None] | None

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        if info is None or not isinstance(info.dataset, _LoaderDataset):
            raise RuntimeError("DatasetRT initialization requires its DataLoader worker")
        info.dataset.prepare(worker_id)
        if self.callback is not None:
            self.callback(worker_id)


def _replica() -> tuple[int, int]:
    if get_worker_info() is not None:
        raise RuntimeError("to_torch_dataloader must run before DataLoader workers start")
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _common_seed(world_size: int, rank: int, shuffle: bool, seed: int | str) -> int | None:
    if not shuffle:
        return None
    if isinstance(seed, int):
        return seed
    if world_size == 1:
        return plan.random_seed()
    values = [plan.random_seed() if rank == 0 else 0]
    dist.broadcast_object_list(values, src=0)
    return int(values[0])


def to_torch_dataloader(dataset: Any, **kwargs: Any) -> DatasetRTDataLoader:
    """See ``CachedDataset.to_torch_dataloader``."""
    import warnings

    extra = dict(kwargs.pop("dataloader_kwargs", None) or {})
    conflicts = plan.RESERVED_KWARGS.intersection(extra)
    if conflicts:
        raise ValueError(
            f"dataloader_kwargs contains reserved arguments: {', '.join(sorted(conflicts))}"
        )
    options = plan.LoaderOptions(
        shuffle=kwargs["shuffle"],
        seed=kwargs["seed"],
        samples_per_epoch=kwargs["samples_per_epoch"],
        partition=kwargs["worker_partition"],
        batch_size=kwargs["batch_size"],
        num_workers=kwargs["num_workers"],
        native_num_workers=kwargs["native_num_workers"],
        drop_last=kwargs["drop_last"],
        pin_memory=kwargs["pin_memory"],
        persistent_workers=kwargs["persistent_workers"],
        timeout=kwargs["timeout"],
        context=kwargs["multiprocessing_context"],
        prefetch=kwargs["prefetch_factor"],
        verbose=kwargs["verbose"],
    )
    rank, world_size = _replica()
    workers = plan.resolve_workers(options, world_size)
    transform = kwargs["sample_transform_fn"]
    _check_picklable(transform, workers.processes)
    tensors = _check_batch_format(kwargs)
    batch_transform = kwargs["batch_transform_fn"]
    _check_picklable(batch_transform, workers.processes, "batch_transform_fn")
    if workers.processes and not workers.persistent and options.resolved_partition != "global":
        warnings.warn(
            "persistent_workers=False restarts DatasetRT readers on every DataLoader pass "
            "with the same sampling seed and reset draw offset or sequential cursor. "
            "With unchanged metadata, each epoch repeats the same sample sequence, "
            "including when seed='random'. Short epochs can repeatedly omit the rest of "
            "the population. Set persistent_workers=True to continue sampling across epochs.",
            UserWarning,
            stacklevel=3,
        )
    samples = options.samples_per_epoch
    if samples is None:
        # dataset-rt 0.4.8 inherits len(dataset): the table's rows, or set_epoch_len's.
        try:
            samples = len(dataset)
        except OverflowError:  # an epoch length of 2**63 or more
            samples = plan.MAX_SAMPLE_BUDGET + 1
    if not 1 <= samples <= plan.MAX_SAMPLE_BUDGET:
        raise ValueError(
            f"inherited samples_per_epoch must be between 1 and {plan.MAX_SAMPLE_BUDGET}"
        )
    seed = _common_seed(world_size, rank, options.shuffle, options.seed)
    mode = options.resolved_partition
    snapshot = _Snapshot(kwargs["work_dir"])
    try:
        config_path = dataset.dump_config(snapshot.directory)
        row_count = dataset.get_metadata().height
        layout = _Layout(
            mode=mode,
            rank=rank,
            world_size=world_size,
            workers=workers.processes,
            batch_size=options.batch_size,
            samples=samples,
            drop_last=options.drop_last,
            persistent=workers.persistent,
            seed=seed,
        )
        order_path = None
        if mode == "global":
            layout.batches_per_rank = plan.global_batches_per_rank(
                samples, world_size, options.batch_size, options.drop_last, rank=rank
            )
            recipe_seed = seed if seed is not None else int(dataset._reader_config.seed)
            use_table = dataset._custom_table
        else:
            layout = _relayout(layout, seed, row_count)
            recipe_seed = 0
            use_table = True
            if options.shuffle and mode == "split":
                order_path = str(snapshot.directory / ORDER_NAME)
                np.save(order_path, _row_order(row_count, plan._require(seed)))
        recipe = _Recipe(
            config_path=str(config_path),
            native_threads=workers.native_threads,
            shuffle=options.shuffle,
            seed=recipe_seed,
            use_table=use_table,
            order_path=order_path,
            cache_dirs=dataset._dir_identities,
        )
        adapter = _LoaderDataset(
            layout,
            recipe,
            transform,
            options.verbose,
            kwargs["batch_format"],
            batch_transform,
            workers.prefetch,
        )
        loader = DatasetRTDataLoader(
            adapter,
            # The tensor path hands torch built batches (torch's auto-batching off).
            batch_size=None if tensors else options.batch_size,
            num_workers=workers.processes,
            collate_fn=_pass_batch if tensors else kwargs["collate_fn"],
            drop_last=False if tensors else options.drop_last,
            pin_memory=options.pin_memory,
            timeout=options.timeout,
            multiprocessing_context=workers.context,
            worker_init_fn=_WorkerInit(kwargs["worker_init_fn"]),
            prefetch_factor=workers.prefetch,
            persistent_workers=workers.persistent,
            **extra,
        )
    except BaseException:
        snapshot.discard()
        raise
    identity = {
        "table_digest": dataset.table_digest(),
        "shuffle": options.shuffle,
        "random_seed": options.seed == "random",
        "row_count": row_count,
    }
    loader._drt_setup(identity, snapshot)
    if options.verbose:
        _event(
            "event=loader_ready pid=%s rank=%s seed=%s num_workers=%s "
            "native_threads_per_consumer=%s partition=%s persistent=%s prefetch_factor=%s "
            "samples=%s samples_per_rank=%s batch_size=%s world_size=%s shuffle=%s",
            os.getpid(),
            rank,
            seed,
            workers.processes,
            workers.native_threads,
            mode,
            workers.persistent,
            workers.prefetch if workers.prefetch is not None else "disabled",
            samples,
            adapter.sample_count(),
            options.batch_size,
            world_size,
            options.shuffle,
        )
    return loader


def _row_order(count: int, seed: int) -> np.ndarray:
    """The shared shuffled row order of "split" mode (dataset-rt 0.4.8's: numpy's
    ``default_rng(seed)`` shuffle of ``0 .. count``)."""
    order = np.arange(count, dtype=np.uint64)
    np.random.default_rng(seed).shuffle(order)
    return order
