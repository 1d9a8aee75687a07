"""The binding: the only module that touches the native library.

Loads ``libdataset_rt.so`` from this package's directory (or from the path in the
developer override ``DATASET_RT_LIBRARY``; there is no search), through the out-of-line
cffi ABI module ``dataset_rt._ffi`` generated at build time from ``dataset_rt.h``.

What it offers the rest of the package (nothing else imports ``ffi`` or ``lib``):

* the header's constants as enums whose values are read from the library (``Kind``,
  ``IoBackend``, ``Stage``...), never retyped;
* :func:`check` / :func:`raise_status`, the one place statuses become exceptions;
* typed handles mirroring the C handles (``Runtime``, ``Dataset``, ``Iterator``,
  ``Lookup``, ``Writer``, ``Commit``): methods named after the C functions
  (``drt_iter_next_batch`` is ``Iterator.next_batch``), an idempotent ``close()``, and
  ``with`` support. ``ffi.gc`` is only a safety net for handles nobody closed; its
  destructor keeps the library's close function alive, so it still runs while the
  interpreter shuts down;
* the conversions at the boundary: native batches to Python values and numpy/pyarrow
  arrays (:class:`Batch`), Arrow columns handed to ``drt_dataset_set_table`` and writer
  columns handed to ``drt_writer_append`` by pointer.

Fork: native handles refuse a forked child on their own (``DRT_E_FORKED``) and closing an
inherited handle there is a native no-op. :func:`check_owner` raises the same error
before a Python-side path could hang first; a :class:`Runtime` applies it whenever it
is used to open a dataset or a writer.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import os
import struct
import sys
import threading
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice, pairwise, repeat
from operator import add, itemgetter, sub
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, NoReturn, Protocol, TypeVar

from dataset_rt._ffi import ffi

LIBRARY_ENV = "DATASET_RT_LIBRARY"
# The C ABI major this module is written against. A header (``_ffi.py``) or a library
# with another major is refused, so a breaking ABI change fails here until the binding
# is updated, instead of misreading structs later.
ABI_MAJOR = 1

_library_path = os.environ.get(LIBRARY_ENV) or str(Path(__file__).with_name("libdataset_rt.so"))
lib: Any = ffi.dlopen(_library_path)

if lib.DRT_ABI_VERSION_MAJOR != ABI_MAJOR:
    raise ImportError(
        f"dataset_rt._ffi was generated from a header with C ABI "
        f"{lib.DRT_ABI_VERSION_MAJOR}.{lib.DRT_ABI_VERSION_MINOR}; "
        f"this dataset_rt needs ABI {ABI_MAJOR}.x"
    )
_loaded_abi = lib.drt_abi_version()
if (_loaded_abi >> 16) != ABI_MAJOR or (_loaded_abi & 0xFFFF) < lib.DRT_ABI_VERSION_MINOR:
    # An older minor lacks functions the header (and so this module) declares.
    raise ImportError(
        f"{_library_path} has C ABI {_loaded_abi >> 16}.{_loaded_abi & 0xFFFF}; "
        f"this dataset_rt needs ABI {ABI_MAJOR}.{lib.DRT_ABI_VERSION_MINOR} or a later 1.x"
    )


# ------------------------------------------------------------------------ constants
# Member names are the header's names without their prefix (DRT_KIND_BOOL: Kind.BOOL);
# tests/test_structure.py checks that every constant of the header is read here.


class Status(enum.IntEnum):
    """Native status codes (``DRT_OK``, ``DRT_E_*``)."""

    OK = lib.DRT_OK
    E_INVALID_ARGUMENT = lib.DRT_E_INVALID_ARGUMENT
    E_INVALID_CACHE = lib.DRT_E_INVALID_CACHE
    E_IO = lib.DRT_E_IO
    E_JSON = lib.DRT_E_JSON
    E_ARROW = lib.DRT_E_ARROW
    E_INDEX = lib.DRT_E_INDEX
    E_OUT_OF_MEMORY = lib.DRT_E_OUT_OF_MEMORY
    E_FORKED = lib.DRT_E_FORKED
    E_EXISTS = lib.DRT_E_EXISTS
    E_OVERFLOW = lib.DRT_E_OVERFLOW
    E_INTERNAL = lib.DRT_E_INTERNAL


class Kind(enum.IntEnum):
    """Metadata value kinds (``DRT_KIND_*``); ``KIND_NAMES`` gives the manifest names."""

    BOOL = lib.DRT_KIND_BOOL
    INT = lib.DRT_KIND_INT
    FLOAT = lib.DRT_KIND_FLOAT
    STRING = lib.DRT_KIND_STRING


#: The manifest's name of each kind ("bool", "int", "float", "string").
KIND_NAMES: dict[int, str] = {kind: kind.name.lower() for kind in Kind}


class Compression(enum.IntEnum):
    """Shard payload compression (``DRT_COMPRESSION_*``)."""

    NONE = lib.DRT_COMPRESSION_NONE
    LZ4 = lib.DRT_COMPRESSION_LZ4


class RemoteCode(enum.IntEnum):
    """What a remote transport callback reports (``DRT_REMOTE_*``)."""

    OK = lib.DRT_REMOTE_OK
    NOT_FOUND = lib.DRT_REMOTE_NOT_FOUND
    DENIED = lib.DRT_REMOTE_DENIED
    RETRY = lib.DRT_REMOTE_RETRY
    FAILED = lib.DRT_REMOTE_FAILED
    #: (ABI 1.8) the object was replaced since its handle was opened (HTTP 412).
    CHANGED = lib.DRT_REMOTE_CHANGED


class IoBackend(enum.IntEnum):
    """Read I/O backends (``DRT_IO_*``); ``IO_BACKENDS`` maps ``ReaderConfig`` names."""

    AUTO = lib.DRT_IO_AUTO
    URING = lib.DRT_IO_URING
    THREADS = lib.DRT_IO_THREADS


#: ``ReaderConfig.io_backend`` values and the backend each selects.
IO_BACKENDS: dict[str, IoBackend] = {
    "auto": IoBackend.AUTO,
    "io_uring": IoBackend.URING,
    "threads": IoBackend.THREADS,
}
#: The name of a backend in use (``Dataset.io_backend()`` never returns AUTO).
IO_BACKEND_NAMES: dict[int, str] = {IoBackend.URING: "io_uring", IoBackend.THREADS: "threads"}


class Sampling(enum.IntEnum):
    """Shuffled sampling modes (``DRT_SAMPLING_*``)."""

    WITH_REPLACEMENT = lib.DRT_SAMPLING_WITH_REPLACEMENT
    PERMUTATION = lib.DRT_SAMPLING_PERMUTATION


class Stage(enum.IntEnum):
    """Writer stages timed with ``WriterFlag.PROFILE`` (``DRT_STAGE_*``); a stage's
    profile name is its member name in lower case (``"record_encode"``)."""

    RECORD_ENCODE = lib.DRT_STAGE_RECORD_ENCODE
    COMPRESSION = lib.DRT_STAGE_COMPRESSION
    DISK_WRITE = lib.DRT_STAGE_DISK_WRITE
    SHARD_FLUSH = lib.DRT_STAGE_SHARD_FLUSH
    FINISH_INDEX = lib.DRT_STAGE_FINISH_INDEX
    FINISH_METADATA = lib.DRT_STAGE_FINISH_METADATA
    FINISH_MANIFEST = lib.DRT_STAGE_FINISH_MANIFEST
    PUBLISH = lib.DRT_STAGE_PUBLISH


STAGE_COUNT: int = lib.DRT_STAGE_COUNT
assert sorted(Stage) == list(range(STAGE_COUNT)), "Stage must list every DRT_STAGE_* index"


class TableType(enum.IntEnum):
    """Value types of an active-table column (``DRT_TYPE_*``)."""

    OTHER = lib.DRT_TYPE_OTHER
    U64 = lib.DRT_TYPE_U64
    U32 = lib.DRT_TYPE_U32
    I64 = lib.DRT_TYPE_I64
    I32 = lib.DRT_TYPE_I32
    F64 = lib.DRT_TYPE_F64
    F32 = lib.DRT_TYPE_F32


class WriterFlag(enum.IntFlag):
    """``drt_writer_options.flags`` bits (``DRT_WRITER_*``)."""

    PROFILE = lib.DRT_WRITER_PROFILE
    REPLACE = lib.DRT_WRITER_REPLACE
    #: (ABI 1.15) the library writes ``metadata.arrow`` from the appended columns.
    METADATA = lib.DRT_WRITER_METADATA


class CommitFlag(enum.IntFlag):
    """``drt_commit_options.flags`` bits (``DRT_COMMIT_*``)."""

    REPLACE = lib.DRT_COMMIT_REPLACE


class BatchFlag(enum.IntFlag):
    """``drt_iter_next_batch`` / ``drt_lookup_get`` flags (``DRT_BATCH_*``)."""

    CONTIGUOUS = lib.DRT_BATCH_CONTIGUOUS
    #: (ABI 1.6) metadata columns from each cache's metadata.arrow, no JSON parsed.
    STORED_METADATA = lib.DRT_BATCH_STORED_METADATA
    #: (ABI 1.8) iterators: a contiguous batch stops at about the byte budget.
    BOUNDED = lib.DRT_BATCH_BOUNDED


class MigrateOutcome(enum.IntEnum):
    """What ``drt_manifest_migrate`` did (``DRT_MIGRATE_*``); the member name in lower case
    is the ``ManifestUpdateEntry.status``."""

    UNCHANGED = lib.DRT_MIGRATE_UNCHANGED
    UPDATED = lib.DRT_MIGRATE_UPDATED
    DURABILITY_UNKNOWN = lib.DRT_MIGRATE_DURABILITY_UNKNOWN


class ManifestMigration(NamedTuple):
    """What ``drt_dataset_migrate_manifests`` did. ``entries``: (resolved manifest path,
    cache id, outcome) of every cache finished, in dataset order (all of them on
    success, none when a check failed). On failure, ``failed`` is the index of the cache
    whose manifest the ``message`` is about; both are None on success."""

    entries: list[tuple[str, int, MigrateOutcome]]
    failed: int | None
    message: str | None


class PublishFlag(enum.IntFlag):
    """``drt_file_publish`` flags (``DRT_PUBLISH_*``)."""

    REPLACE = lib.DRT_PUBLISH_REPLACE


# ------------------------------------------------------------------------ statuses

# Every failing status and the Python exception it becomes (the header's comments).
_EXCEPTIONS: dict[int, type[Exception]] = {
    Status.E_INVALID_ARGUMENT: ValueError,
    Status.E_INVALID_CACHE: ValueError,
    Status.E_EXISTS: ValueError,
    Status.E_INDEX: IndexError,
    Status.E_OUT_OF_MEMORY: MemoryError,
    Status.E_OVERFLOW: OverflowError,
    Status.E_IO: RuntimeError,
    Status.E_JSON: RuntimeError,
    Status.E_ARROW: RuntimeError,
    Status.E_FORKED: RuntimeError,
    Status.E_INTERNAL: RuntimeError,
}
assert set(_EXCEPTIONS) == set(Status) - {Status.OK}, "a status without an exception"

#: Builds the exception for a failing status from its message (an exception class).
ErrorFactory = Callable[[str], Exception]


def last_error() -> str:
    """This thread's last native error message."""
    return ffi.string(lib.drt_last_error()).decode("utf-8", "replace")


def raise_status(status: int, error: ErrorFactory | None = None) -> NoReturn:
    """Raise the documented Python exception for a failing native status, with this
    thread's message; with ``error``, raise ``error(message)`` instead (callers that
    report failures as values, like the writer, pass their own exception type)."""
    message = last_error()
    raise_interrupt()
    if error is not None:
        raise error(message)
    raise _EXCEPTIONS.get(status, RuntimeError)(message)


def raise_interrupt() -> None:
    """Raise the interrupt a transport callback of this thread's last call kept (see
    ``_remote_failure``), if any, and forget it."""
    interrupt = getattr(_interrupted, "exception", None)
    if interrupt is not None:
        _interrupted.exception = None
        raise interrupt


def check(status: int, error: ErrorFactory | None = None) -> None:
    """Raise for a non-zero native status (see :func:`raise_status`). For DRT_OK, raise
    an interrupt a transport callback of the call kept: the library may do without the
    read it failed (a fetch ahead is read again), but the Ctrl-C is the caller's."""
    if status != 0:
        raise_status(status, error)
    if _interrupts_kept:
        raise_interrupt()


FORK_MESSAGE = (
    "dataset_rt objects cannot be used in a forked child process; "
    "create the runtime and dataset in the child"
)


def replaced_error(path: str | os.PathLike[str]) -> ValueError:
    """The library's error for a cache directory that was replaced (rebuilt) or removed
    while a dataset had it open (``Cache.replacedError``), for the checks made in Python."""
    return ValueError(
        f"cache {os.fspath(path)} was replaced (rebuilt) or removed while this dataset was "
        "open; open it again"
    )


def check_owner(pid: int) -> None:
    """Raise the fork error when called in a process other than ``pid``.

    The native handles refuse a forked child on their own; this guards the Python-side
    paths that would otherwise hang there first (Polars' thread pool, inherited from the
    parent, deadlocks in a forked child) or report the error as a per-source result."""
    if os.getpid() != pid:
        raise RuntimeError(FORK_MESSAGE)


# ------------------------------------------------------------------------ library facts


def library_path() -> str:
    """Where the loaded library came from."""
    return _library_path


def version() -> str:
    """``drt_version``: the library's version, e.g. ``"0.1.0"``."""
    return ffi.string(lib.drt_version()).decode()


def abi_version() -> tuple[int, int]:
    """``drt_abi_version``: the loaded library's C ABI as (major, minor)."""
    abi = lib.drt_abi_version()
    return abi >> 16, abi & 0xFFFF


def io_uring_available() -> bool:
    """``drt_io_uring_available``: whether this process may use io_uring."""
    return bool(lib.drt_io_uring_available())


def sha256_implementation() -> str:
    """``drt_sha256_implementation``: ``"sha-ni"`` or ``"portable"``."""
    return ffi.string(lib.drt_sha256_implementation()).decode()


def staging_sweep(base_dir: str | os.PathLike[str]) -> int:
    """``drt_staging_sweep``: remove abandoned staging directories under
    ``<base_dir>/tmp/``. Returns the status (callers sweep on a best-effort basis)."""
    raw = encode_path(base_dir)
    return int(lib.drt_staging_sweep(raw, len(raw)))


def source_name_check(name: str, error: ErrorFactory | None = None) -> None:
    """``drt_source_name_check``: raise (``ValueError``, or ``error(message)``) unless
    ``name`` can name a cache; the rules and messages are the library's."""
    raw = name.encode("utf-8")
    check(lib.drt_source_name_check(raw, len(raw)), error)


def manifest_migrate(manifest_path: str | os.PathLike[str], cache_id: int) -> MigrateOutcome:
    """``drt_manifest_migrate``: rewrite the format-2 manifest file ``manifest_path`` (a
    resolved path) as format 3 with ``cache_id``, atomically; leave a format-3 one alone.
    Raises ``ValueError`` (cache id changed) or ``RuntimeError`` (I/O, JSON)."""
    raw = encode_path(manifest_path)
    out = ffi.new("int32_t *")
    check(lib.drt_manifest_migrate(raw, len(raw), cache_id, out))
    return MigrateOutcome(out[0])


def file_publish(
    directory: str | os.PathLike[str], name: str, data: bytes | memoryview, flags: int = 0
) -> bool:
    """``drt_file_publish``: publish ``data`` as ``directory/name`` atomically (never
    replacing an existing file unless ``PublishFlag.REPLACE``: ``ValueError`` then).
    Returns False when only the final directory fsync failed."""
    raw_dir = encode_path(directory)
    raw_name = encode_path(name)
    out = ffi.new("int32_t *")
    buffer = ffi.from_buffer(data)
    check(
        lib.drt_file_publish(
            raw_dir, len(raw_dir), raw_name, len(raw_name), buffer, len(buffer), flags, out
        )
    )
    return bool(out[0])


# ------------------------------------------------------------------------ arguments


def encode_path(path: str | os.PathLike[str]) -> bytes:
    """A path as the bytes the OS sees (surrogate-escaped names round-trip)."""
    return os.fsencode(path)


class PathArray:
    """A ``drt_str[]`` of paths (``.array``, ``.count``) for one native call. Keep the
    object alive for the call: it owns the encoded bytes the entries point into."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        self._encoded = [encode_path(p) for p in paths]
        self.count = len(self._encoded)
        self.array = ffi.new("drt_str[]", max(1, self.count))
        for entry, raw in zip(self.array, self._encoded):
            entry.ptr = ffi.from_buffer(raw)
            entry.len = len(raw)


def _text(value: Any) -> bytes:
    """The bytes of a ``drt_str`` (empty for ``{NULL, 0}``)."""
    if value.ptr == ffi.NULL:
        return b""
    return ffi.buffer(value.ptr, value.len)[:]


# ------------------------------------------------------------------------ handles

H = TypeVar("H", bound="_Handle")


def _destructor(close: Callable[[Any], None]) -> Callable[[Any], None]:
    """The ``ffi.gc`` destructor calling ``close``. The closure holds ``close`` and
    ``lib`` itself, never module globals, which the interpreter clears at shutdown
    before the last handles are collected."""

    def destroy(pointer: Any, close: Callable[[Any], None] = close, keep: Any = lib) -> None:
        close(pointer)

    return destroy


class _Handle:
    """An owned native handle: ``close()`` releases it once (later calls do nothing);
    ``ffi.gc`` releases it when the object is collected without being closed.

    Like the C handles, one is used by one thread at a time unless the C function says
    otherwise; ``close()`` must not race a call on the same handle."""

    __slots__ = ("__weakref__", "_pointer")
    #: The ``ffi.gc`` destructor: ``_destructor(lib.drt_<handle>_close)``.
    _destroy: ClassVar[Callable[[Any], None]]

    def __init__(self, pointer: Any, keep: object = None) -> None:
        """Own ``pointer``; ``keep`` (an object the native handle uses, such as the
        callbacks of a ``Remote``) stays alive until the handle is released."""
        destroy = type(self)._destroy
        if keep is not None:
            # The destructor holds ``keep`` (its default) until it has run.
            def destroy(raw: Any, release: Any = destroy, _keep: object = keep) -> None:
                release(raw)

        self._pointer: Any = ffi.gc(pointer, destroy)

    @property
    def _ptr(self) -> Any:
        pointer = self._pointer
        if pointer is None:
            raise ValueError(f"the native {type(self).__name__.lower()} handle is closed")
        return pointer

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._pointer is None

    def close(self, _release: Callable[[Any], None] = ffi.release) -> None:
        """Release the native handle now (idempotent; a native no-op in a forked child)."""
        pointer, self._pointer = self._pointer, None
        if pointer is not None:
            _release(pointer)  # runs the ffi.gc destructor now and disarms it

    def __enter__(self: H) -> H:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Runtime(_Handle):
    """``drt_runtime``: a pool of exactly ``num_workers`` native threads, owned by the
    process that opened it (``pid``)."""

    __slots__ = ("num_workers", "pid")
    _destroy = staticmethod(_destructor(lib.drt_runtime_close))

    def __init__(self, pointer: Any, num_workers: int) -> None:
        super().__init__(pointer)
        self.num_workers = num_workers
        self.pid = os.getpid()

    @classmethod
    def open(cls, num_workers: int) -> Runtime:
        """``drt_runtime_open``: start the pool (ValueError for 0 workers)."""
        out = ffi.new("drt_runtime **")
        check(lib.drt_runtime_open(num_workers, out))
        return cls(out[0], num_workers)

    def _owned(self) -> Any:
        """The pointer, after the fork check (see :func:`check_owner`)."""
        check_owner(self.pid)
        return self._ptr


# ---------------------------------------------------------------- dataset


class DatasetOptions(NamedTuple):
    """``drt_dataset_options``."""

    seed: int
    prefetch_size: int
    shuffle: bool
    validate_cache: bool
    io_backend: IoBackend = IoBackend.AUTO
    sampling: Sampling = Sampling.WITH_REPLACEMENT
    #: With ``validate_cache`` (ABI 1.16, caches on object storage 1.17): a damaged
    #: cache's error names every damaged file, one per line.
    name_every_damaged_file: bool = False


class CacheInfo(NamedTuple):
    """``drt_cache_info``: facts about one cache of a dataset."""

    cache_id: int
    sample_count: int
    shard_count: int
    format_version: int
    compression: int
    compression_ratio: float
    source_name: bytes
    path: bytes
    #: The manifest's fingerprint, or None when it has none.
    fingerprint: str | None


class IoStats(NamedTuple):
    """``drt_io_stats``: read counters of a dataset."""

    uring_reads: int
    pool_reads: int
    lookup_reads: int
    bytes_read: int


class Stream(NamedTuple):
    """``drt_stream``: the next stream position and the end of a pending window."""

    position: int
    window_end: int


class IterRange(NamedTuple):
    """``drt_iter_range``: the stream positions an iterator reads."""

    start: int
    count: int
    block_len: int = 0
    block_stride: int = 0


# Arrow value types accepted by drt_dataset_set_table: identity and weight columns.
_ID_TYPES = {
    "uint64": TableType.U64,
    "uint32": TableType.U32,
    "int64": TableType.I64,
    "int32": TableType.I32,
}
_WEIGHT_TYPES = {**_ID_TYPES, "double": TableType.F64, "float": TableType.F32}


def _table_column(array: Any, accepted: dict[str, TableType], keep: list[Any]) -> Any:
    """A ``drt_table_column`` describing one pyarrow Array (zero-copy: it points into
    the array's buffers, which ``keep`` holds for the call)."""
    column = ffi.new("drt_table_column *")
    type_code = accepted.get(str(array.type), TableType.OTHER)
    column.type = type_code
    validity = array.buffers()[0] if array.null_count else None
    # A NullArray (Polars' Null dtype) has no bitmap: as in 0.4.8 its cells are not
    # "null" to the checks, which fail on its type instead.
    if validity is not None:
        column.offset = array.offset
        keep.append(validity)
        column.validity = ffi.cast("uint8_t *", validity.address)
    if type_code:
        values = array.buffers()[1]
        keep.append(values)
        width = array.type.bit_width // 8
        column.values = ffi.cast("void *", values.address + array.offset * width)
    keep.append(array)
    return column


def _dataset_options(options: DatasetOptions) -> Any:
    """A ``drt_dataset_options *`` of ``options``."""
    return ffi.new(
        "drt_dataset_options *",
        {
            "seed": options.seed,
            "prefetch_size": options.prefetch_size,
            "shuffle": 1 if options.shuffle else 0,
            "validate_cache": (2 if options.name_every_damaged_file else 1)
            if options.validate_cache
            else 0,
            "io_backend": int(options.io_backend),
            "sampling": int(options.sampling),
        },
    )


# ---------------------------------------------------------------- object storage


class RemoteError(Exception):
    """Raised by a :class:`RemoteTransport` method: ``code`` says how the core treats it
    (``RETRY`` is retried with backoff; the others fail at once)."""

    def __init__(self, code: RemoteCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class RemoteTransport(Protocol):
    """What :class:`Remote` calls, from native threads (cffi takes the GIL; the methods
    should release it while they wait on the network, as obstore does). Raise
    :class:`RemoteError` to report a failure; any other exception is ``FAILED``."""

    def open(self, url: str) -> tuple[int, Any]:
        """``(size, handle)`` of the object at ``url``. The handle should pin the version
        seen now (its ETag): reads of it then raise ``RemoteError(CHANGED, ...)`` once the
        object was replaced."""
        ...

    def read(self, handle: Any, offset: int, length: int) -> Any:
        """Exactly ``length`` bytes at ``offset`` (any buffer), of the version ``open``
        pinned."""
        ...

    # Optional: ``read_into(handle, offset, out: memoryview) -> int`` writes the bytes at
    # ``offset`` straight into ``out`` (a shard file's mapping, or the core's buffer of a
    # byte-range read) and returns how many it wrote; when a transport has it,
    # :class:`Remote` calls it instead of ``read``.
    # Optional: ``read_to_file(handle, offset, length, fd) -> int`` writes the ``length``
    # bytes at ``offset`` into the file ``fd`` at ``offset`` (``os.pwrite``; several threads
    # write ranges of one file at once) and returns how many it wrote; when a transport
    # has it, whole-file downloads use it (``drt_remote_set_read_file``).

    def close(self, handle: Any) -> None: ...


def _say(message: Any, cap: int, text: str) -> None:
    raw = text.encode("utf-8", "replace")[: max(0, cap - 1)]
    ffi.memmove(message, raw + b"\0", len(raw) + 1)


# A KeyboardInterrupt or SystemExit raised in a transport callback (by a signal handler,
# on the thread that called into the library), kept for that call to raise (check).
_interrupted = threading.local()
# Whether any was ever kept: until then check() does not look at the thread-local.
_interrupts_kept = False


def _keep_interrupt(exc: BaseException) -> None:
    global _interrupts_kept
    _interrupted.exception = exc
    _interrupts_kept = True


def _remote_failure(exc: BaseException, message: Any, cap: int) -> int:
    """The status and message a transport callback returns for ``exc``. An interrupt
    fails the read (``FAILED``: never retried) and is raised again, unchanged, when the
    library call that made the callback returns its error."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        _keep_interrupt(exc)
        _say(message, cap, f"interrupted ({type(exc).__name__})")
        return int(RemoteCode.FAILED)
    code = exc.code if isinstance(exc, RemoteError) else RemoteCode.FAILED
    _say(message, cap, str(exc) or type(exc).__name__)
    return int(code)


class Remote(_Handle):
    """``drt_remote``: an object-store transport (``transport``, called back from native
    threads through a ``drt_remote_ops`` table) and its local directory: fetched
    manifests, indexes and metadata, and the shard cache with its byte budget.

    The callbacks live as long as this object: keep it alive while any dataset opened
    with it is in use (``dataset_rt.remote`` keeps one per configuration for the life of
    the process)."""

    __slots__ = ("_callbacks", "_handles", "_next", "transport")
    _destroy = staticmethod(_destructor(lib.drt_remote_close))

    @classmethod
    def open(
        cls,
        transport: RemoteTransport,
        cache_dir: str | os.PathLike[str],
        budget_bytes: int,
        retries: int = 5,
    ) -> Remote:
        """``drt_remote_open``."""
        handles: dict[int, Any] = {}
        counter = iter(range(1, 2**62))

        def on_open(context: Any, url: Any, size: Any, handle: Any, message: Any, cap: int) -> int:
            try:
                n, obj = transport.open(ffi.string(url).decode("utf-8", "surrogateescape"))
                key = next(counter)
                handles[key] = obj
                size[0] = n
                handle[0] = ffi.cast("void *", key)
                return 0
            except BaseException as exc:
                return _remote_failure(exc, message, cap)

        def moved(handle: Any, length: int, message: Any, cap: int, move: Any) -> int:
            """``move(obj)`` for the object of ``handle``, which returns the bytes it moved:
            0 when that is ``length`` (a short body is ``RETRY``), else the failure's code
            and message."""
            try:
                got = move(handles[int(ffi.cast("uintptr_t", handle))])
                if got != length:
                    raise RemoteError(RemoteCode.RETRY, f"short read: {got} of {length} bytes")
                return 0
            except BaseException as exc:
                return _remote_failure(exc, message, cap)

        read_into = getattr(transport, "read_into", None)
        read_to_file = getattr(transport, "read_to_file", None)

        def copy_read(obj: Any, offset: int, buf: Any, length: int) -> int:
            """``transport.read`` into ``buf`` (transports without ``read_into``)."""
            data = memoryview(transport.read(obj, offset, length)).cast("B")
            if len(data) == length:
                ffi.memmove(buf, data, length)
            return len(data)

        def on_read(
            context: Any, handle: Any, offset: int, buf: Any, length: int, message: Any, cap: int
        ) -> int:
            if read_into is not None:
                return moved(
                    handle,
                    length,
                    message,
                    cap,
                    lambda o: read_into(o, offset, memoryview(ffi.buffer(buf, length))),
                )
            return moved(handle, length, message, cap, lambda o: copy_read(o, offset, buf, length))

        def on_read_file(
            context: Any, handle: Any, offset: int, length: int, fd: int, message: Any, cap: int
        ) -> int:
            return moved(
                handle, length, message, cap, lambda o: read_to_file(o, offset, length, fd)
            )

        def on_close(context: Any, handle: Any) -> None:
            obj = handles.pop(int(ffi.cast("uintptr_t", handle)), None)
            if obj is not None:
                try:
                    transport.close(obj)
                except Exception:
                    pass

        # An exception escaping a callback (outside its try: a signal handler's, raised
        # on entry or on return) makes the callback return ``error``, a failure: never
        # DRT_REMOTE_OK for bytes that were not read. An interrupt is kept for the call to
        # raise; anything else cffi prints.
        failed = int(RemoteCode.FAILED)

        def escaped(kind: Any, exc: BaseException, traceback: Any) -> int | None:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                _keep_interrupt(exc)
                return failed
            return None

        callbacks = (
            ffi.callback(
                "int32_t(void *, const char *, uint64_t *, void **, char *, uint64_t)",
                on_open,
                error=failed,
                onerror=escaped,
            ),
            ffi.callback(
                "int32_t(void *, void *, uint64_t, uint8_t *, uint64_t, char *, uint64_t)",
                on_read,
                error=failed,
                onerror=escaped,
            ),
            ffi.callback("void(void *, void *)", on_close),
            ffi.callback(
                "int32_t(void *, void *, uint64_t, uint64_t, int32_t, char *, uint64_t)",
                on_read_file,
                error=failed,
                onerror=escaped,
            ),
        )
        raw_dir = encode_path(cache_dir)
        options = ffi.new("drt_remote_options *")
        options.ops.context = ffi.NULL
        options.ops.open, options.ops.read, options.ops.close = callbacks[:3]
        options.cache_dir.ptr = ffi.from_buffer(raw_dir)
        options.cache_dir.len = len(raw_dir)
        options.budget_bytes = budget_bytes
        options.retries = retries
        out = ffi.new("drt_remote **")
        check(lib.drt_remote_open(options, out))
        self = cls(out[0])
        if read_to_file is not None:
            self.set_read_file(callbacks[3])
        self._callbacks = callbacks
        self._handles = handles
        self._next = counter
        self.transport = transport
        return self

    def set_read_file(self, read_file: Any) -> None:
        """``drt_remote_set_read_file`` (ABI 1.10): whole-file downloads are written into
        their files by ``read_file`` (a ``drt_remote_read_file_fn`` cffi callback the caller
        keeps alive; ``ffi.NULL``: through a mapping with the ``read`` callback)."""
        check(lib.drt_remote_set_read_file(self._ptr, read_file))

    def set_release(self, release: Any) -> None:
        """``drt_remote_set_release`` (ABI 1.18): ``release`` (a ``drt_remote_release_fn``
        cffi callback the caller keeps alive until it was called; ``ffi.NULL``: none) is
        called once, with the transport's context, after the last reference to the remote
        is dropped (this object closed, every dataset opened with it closed, every fetch
        ahead ended); no transport callback follows it."""
        check(lib.drt_remote_set_release(self._ptr, release))


class Dataset(_Handle):
    """``drt_dataset``: caches opened together, their active table and stream. Every
    method is thread-safe (as the C functions are)."""

    __slots__ = ()
    _destroy = staticmethod(_destructor(lib.drt_dataset_close))

    @classmethod
    def open(
        cls, runtime: Runtime, paths: Sequence[str | os.PathLike[str]], options: DatasetOptions
    ) -> Dataset:
        """``drt_dataset_open``: open and check the caches at ``paths`` (in order)."""
        native_options = _dataset_options(options)
        strs = PathArray(paths)
        out = ffi.new("drt_dataset **")
        check(lib.drt_dataset_open(runtime._owned(), strs.array, strs.count, native_options, out))
        return cls(out[0])

    @classmethod
    def open_remote(
        cls,
        runtime: Runtime,
        paths: Sequence[str | os.PathLike[str]],
        options: DatasetOptions,
        remote: Remote,
    ) -> Dataset:
        """``drt_dataset_open_remote``: as :meth:`open`, where URL paths are caches on
        object storage reached through ``remote`` (which the dataset keeps alive)."""
        native_options = _dataset_options(options)
        strs = PathArray(paths)
        out = ffi.new("drt_dataset **")
        check(
            lib.drt_dataset_open_remote(
                runtime._owned(), strs.array, strs.count, native_options, remote._ptr, out
            )
        )
        # The native remote is reference counted; its Python callbacks live with `remote`.
        return cls(out[0], keep=remote)

    def cache_dir(self, index: int) -> bytes:
        """``drt_dataset_cache_dir``: the local directory of cache ``index`` (its fetched
        copy for a remote cache)."""
        out = ffi.new("drt_str *")
        check(lib.drt_dataset_cache_dir(self._ptr, index, out))
        return _text(out[0])

    def _u64(self, function: Any) -> int:
        out = ffi.new("uint64_t *")
        check(function(self._ptr, out))
        return int(out[0])

    def cache_count(self) -> int:
        """``drt_dataset_cache_count``."""
        return self._u64(lib.drt_dataset_cache_count)

    def field_count(self) -> int:
        """``drt_dataset_field_count``."""
        return self._u64(lib.drt_dataset_field_count)

    def field(self, index: int) -> tuple[str, Kind]:
        """``drt_dataset_field``: schema field ``index`` as (name, kind)."""
        field = ffi.new("drt_field *")
        check(lib.drt_dataset_field(self._ptr, index, field))
        return _text(field.name).decode("utf-8"), Kind(field.kind)

    def fields(self) -> list[tuple[str, Kind]]:
        """The metadata schema as (name, kind) pairs, in manifest order."""
        return [self.field(i) for i in range(self.field_count())]

    def io_backend(self) -> IoBackend:
        """``drt_dataset_io_backend``: URING or THREADS."""
        out = ffi.new("int32_t *")
        check(lib.drt_dataset_io_backend(self._ptr, out))
        return IoBackend(out[0])

    def io_stats(self) -> IoStats:
        """``drt_dataset_io_stats``."""
        out = ffi.new("drt_io_stats *")
        check(lib.drt_dataset_io_stats(self._ptr, out))
        return IoStats(
            int(out.uring_reads), int(out.pool_reads), int(out.lookup_reads), int(out.bytes_read)
        )

    def migrate_manifests(self) -> ManifestMigration:
        """``drt_dataset_migrate_manifests``: migrate every cache's manifest to format 3,
        all or nothing (checked against the manifests loaded at open). A failure of a
        manifest (I/O, JSON, changed, downgraded, duplicate) is returned, not raised;
        others raise (``RuntimeError`` in a forked child, ``MemoryError``, ...)."""
        count = self.cache_count()
        native = ffi.new("drt_manifest_entry[]", count)
        done = ffi.new("uint64_t *")
        failed = ffi.new("uint64_t *")
        status = lib.drt_dataset_migrate_manifests(self._ptr, native, count, done, failed)
        entries = [
            (os.fsdecode(_text(entry.path)), int(entry.cache_id), MigrateOutcome(entry.outcome))
            for entry in native[0 : int(done[0])]
        ]
        if status == Status.OK:
            return ManifestMigration(entries, None, None)
        if status not in (Status.E_IO, Status.E_JSON, Status.E_INVALID_CACHE) or failed[0] >= count:
            raise_status(status)
        return ManifestMigration(entries, int(failed[0]), last_error())

    def cache_info(self, index: int) -> CacheInfo:
        """``drt_dataset_cache_info``: facts about cache ``index`` (strings copied)."""
        info = ffi.new("drt_cache_info *")
        check(lib.drt_dataset_cache_info(self._ptr, index, info))
        fingerprint = None
        if info.fingerprint.ptr != ffi.NULL:
            fingerprint = _text(info.fingerprint).decode("utf-8")
        return CacheInfo(
            cache_id=int(info.cache_id),
            sample_count=int(info.sample_count),
            shard_count=int(info.shard_count),
            format_version=int(info.format_version),
            compression=int(info.compression),
            compression_ratio=float(info.compression_ratio),
            source_name=_text(info.source_name),
            path=_text(info.path),
            fingerprint=fingerprint,
        )

    def set_table(self, row_count: int, cache_ids: Any, sample_ids: Any, weights: Any) -> None:
        """``drt_dataset_set_table``: validate and install the active table given by
        three pyarrow Arrays (not chunked), passed by pointer (no copy)."""
        keep: list[Any] = []
        check(
            lib.drt_dataset_set_table(
                self._ptr,
                row_count,
                _table_column(cache_ids, _ID_TYPES, keep),
                _table_column(sample_ids, _ID_TYPES, keep),
                _table_column(weights, _WEIGHT_TYPES, keep),
            )
        )

    def epoch_len(self) -> int:
        """``drt_dataset_epoch_len``."""
        return self._u64(lib.drt_dataset_epoch_len)

    def set_epoch_len(self, epoch_len: int) -> None:
        """``drt_dataset_set_epoch_len``."""
        check(lib.drt_dataset_set_epoch_len(self._ptr, epoch_len))

    def set_prefetch_bytes(self, prefetch_bytes: int) -> None:
        """``drt_dataset_set_prefetch_bytes`` (0: automatic)."""
        check(lib.drt_dataset_set_prefetch_bytes(self._ptr, prefetch_bytes))

    def stream(self) -> Stream:
        """``drt_dataset_stream``."""
        out = ffi.new("drt_stream *")
        check(lib.drt_dataset_stream(self._ptr, out))
        return Stream(int(out.position), int(out.window_end))

    def set_stream(self, stream: Stream) -> None:
        """``drt_dataset_set_stream``."""
        native = ffi.new(
            "drt_stream *", {"position": stream.position, "window_end": stream.window_end}
        )
        check(lib.drt_dataset_set_stream(self._ptr, native))

    def table_digest(self) -> bytes:
        """``drt_dataset_table_digest``: the SHA-256 identifying the active table."""
        out = ffi.new("uint8_t[32]")
        check(lib.drt_dataset_table_digest(self._ptr, out))
        return bytes(ffi.buffer(out, 32))


# ---------------------------------------------------------------- reading


class _Memory:
    """Native memory for ``numpy.asarray`` (the array interface) that keeps ``owner``,
    the handle whose buffer it is, alive as long as any array made from it: a view of a
    lookup's batch outlives the dataset that made it without pointing at freed memory."""

    __slots__ = ("__array_interface__", "_owner")

    def __init__(self, pointer: Any, count: int, typestr: str, owner: object) -> None:
        address = int(ffi.cast("uintptr_t", pointer)) if count else 0
        self.__array_interface__ = {
            "data": (address, False),
            "shape": (count,),
            "typestr": typestr,
            "version": 3,
        }
        self._owner = owner


class Batch:
    """A view of a ``drt_batch`` filled by :meth:`Iterator.next_batch` or
    :meth:`Lookup.get`: valid until the next call on its owner or the owner's close.
    The methods copy what they return unless they say otherwise."""

    __slots__ = ("_owner", "_raw")

    def __init__(self, raw: Any, owner: object = None) -> None:
        self._raw = raw
        # The handle that filled it (kept alive by the arrays `arrays(False)` returns).
        self._owner = owner

    @property
    def count(self) -> int:
        """Samples in the batch (0 at the end of an iterator's window)."""
        return int(self._raw.count)

    def rows(
        self, kinds: Sequence[int], buffers: PayloadBuffers | None = None
    ) -> tuple[Sequence[bytes], list[int], list[int], list[list[Any]], int]:
        """Everything in the batch as Python values: ``(payloads, cache_ids, sample_ids,
        columns, longest)``, one list per metadata field of ``kinds`` (plain ints, schema
        order), and the length of the longest payload.

        Per batch, a handful of C-level copies (``ffi.unpack``; no numpy: its per-call
        overhead would dominate small batches); no bytecode runs per sample.

        A contiguous batch (``BatchFlag.CONTIGUOUS``) has its payloads back to back in one
        buffer: one ``struct`` unpack cuts it into ``bytes`` objects (a tuple), about four
        times cheaper than a slice per payload. Otherwise payloads live in several native
        buffers (and shard mappings): one cffi buffer spanning from the lowest payload
        address past the highest end (bounded by the highest start plus the longest
        length) lets each be sliced out with one C-level copy (slicing reads only the
        payloads' own bytes, never the gaps between buffers), by C-level ``map`` calls.
        A payload the iterator read into one of ``buffers`` (:class:`PayloadBuffers`) is
        that ``bytes`` object, not copied."""
        raw = self._raw
        n = int(raw.count)
        if n == 0:
            return [], [], [], [[] for _ in kinds], 0
        base = raw.payload_base
        payloads: Sequence[bytes]
        if base != ffi.NULL:
            # Contiguous: payload i starts where payload i - 1 ends (drt_batch).
            longest = _same_u64(raw.payload_lens, n)
            if longest is not None:
                unpacker = _equal_payloads(longest, n)
            else:
                lengths = ffi.unpack(raw.payload_lens, n)
                longest = max(lengths)
                unpacker = struct.Struct("s".join(map(str, lengths)) + "s")
            payloads = unpacker.unpack_from(ffi.buffer(base, unpacker.size))
        else:
            starts = ffi.unpack(ffi.cast("uint64_t *", raw.payloads), n)
            taken = None if buffers is None else buffers.take_run(starts)
            if taken is not None:
                # Every payload in the next given buffers (large records read straight
                # into them, the usual case): those objects, in order.
                return self._rest(taken, max(map(len, taken)), kinds)
            lengths = ffi.unpack(raw.payload_lens, n)
            longest = max(lengths)
            low = min(starts)
            span = ffi.buffer(ffi.cast("uint8_t *", low), max(starts) - low + longest)
            at = list(map(sub, starts, repeat(low)))
            if buffers is not None and buffers.pending:
                # Large records (a few a batch): each either in the next given buffer or
                # copied as below.
                take = buffers.take
                payloads = [
                    take(start) or span[a : a + length]
                    for start, a, length in zip(starts, at, lengths, strict=True)
                ]
            else:
                payloads = list(map(span.__getitem__, map(slice, at, map(add, at, lengths))))
        return self._rest(payloads, longest, kinds)

    def _rest(
        self, payloads: Sequence[bytes], longest: int, kinds: Sequence[int]
    ) -> tuple[Sequence[bytes], list[int], list[int], list[list[Any]], int]:
        """``rows`` once its payloads are made: the identities and metadata columns."""
        raw = self._raw
        n = len(payloads)
        columns = raw.columns
        values = [_column_values(columns[i], kind, n) for i, kind in enumerate(kinds)]
        # Batches nearly always come from one cache: one int object then.
        cache_id = _same_u64(raw.cache_ids, n)
        cache_ids = ffi.unpack(raw.cache_ids, n) if cache_id is None else [cache_id] * n
        return payloads, cache_ids, ffi.unpack(raw.sample_ids, n), values, longest

    def run(self) -> tuple[int, int, int]:
        """The batch's leading run: see ``batch_run``."""
        return batch_run(self)

    def copy_payloads(self, destination: Any) -> int:
        """The payloads back to back into ``destination``: see ``batch_copy_payloads``."""
        return batch_copy_payloads(self, destination)

    def lengths_and_ids(self) -> tuple[Any, Any, Any]:
        """``(payload_lens, cache_ids, sample_ids)`` as ``numpy.uint64`` views of the
        batch (valid as long as it is), for any batch, contiguous or not."""
        import numpy as np

        raw = self._raw
        n = int(raw.count)
        return tuple(  # type: ignore[return-value]
            np.frombuffer(ffi.buffer(pointer, 8 * n), dtype=np.uint64)
            for pointer in (raw.payload_lens, raw.cache_ids, raw.sample_ids)
        )

    def words_into(self, destination: Any, places: Sequence[tuple[int, int]]) -> bytes:
        """Copy 8-byte arrays of the batch into the writable buffer ``destination`` (e.g.
        a ``numpy.uint8`` array) and return its payload lengths (``count`` uint64) as
        bytes. ``places``: ``(source, offset)`` pairs, ``source`` ``-1`` for the cache
        ids, ``-2`` for the sample ids, else the index of an ``INT`` or ``FLOAT``
        metadata column; each array lands at byte ``offset``. One buffer conversion and
        a ``memmove`` an array: a fraction of what numpy views of each cost (the PyTorch
        loader builds a batch's header with it). Raises ``ValueError`` (nothing copied)
        when an array does not fit."""
        raw = self._raw
        n = int(raw.count)
        target = ffi.from_buffer("uint8_t[]", destination, require_writable=True)
        size = len(target)
        for _, offset in places:
            if offset < 0 or offset + 8 * n > size:
                raise ValueError(f"{8 * n} bytes at {offset} do not fit a buffer of {size}")
        for source, offset in places:
            if source == -1:
                pointer = raw.cache_ids
            elif source == -2:
                pointer = raw.sample_ids
            else:
                pointer = raw.columns[source].values
            ffi.memmove(target + offset, pointer, 8 * n)
        return ffi.buffer(raw.payload_lens, 8 * n)[:]

    def column_values(self, index: int, kind: int) -> list[Any]:
        """Metadata column ``index`` (of ``kind``) as a list of Python values."""
        raw = self._raw
        return _column_values(raw.columns[index], int(kind), int(raw.count))

    def arrays(self, copy: bool) -> tuple[Any, Any, Any, Any]:
        """A contiguous batch (``BatchFlag.CONTIGUOUS``) as numpy arrays ``(data,
        offsets, cache_id, sample_id)``: ``data`` uint8 with ``count + 1`` uint64
        ``offsets`` (always a new array). With ``copy`` false, ``data``, ``cache_id`` and
        ``sample_id`` are views of the native buffers (valid as long as the batch; they
        keep the batch's owner alive, not its contents: the owner's next call reuses
        them)."""
        import numpy as np

        raw = self._raw
        n = int(raw.count)
        # The payloads lie back to back from payload_base: payload_offsets, and the end.
        offsets = np.empty(n + 1, dtype=np.uint64)
        offsets[0] = 0
        if n > 0:
            offsets[:n] = np.frombuffer(ffi.buffer(raw.payload_offsets, 8 * n), dtype=np.uint64)
            offsets[n] = raw.payload_offsets[n - 1] + raw.payload_lens[n - 1]
        owner = self._owner
        data = np.asarray(_Memory(raw.payload_base, int(offsets[n]), "|u1", owner))
        cache_id = np.asarray(_Memory(raw.cache_ids, n, "<u8", owner))
        sample_id = np.asarray(_Memory(raw.sample_ids, n, "<u8", owner))
        if copy:
            data, cache_id, sample_id = data.copy(), cache_id.copy(), sample_id.copy()
        return data, offsets, cache_id, sample_id

    def column_array(self, index: int, kind: int) -> Any:
        """Metadata column ``index`` (of ``kind``) as a numpy array (int64, float64,
        bool) or a pyarrow string array, always copied: ``string_view`` (Arrow's
        Utf8View, ``drt_column_string_views``), which Polars takes without converting,
        where pyarrow builds it (``_string_view_type``) and the column fits 32-bit view
        offsets, else ``large_string``. Either is the same Polars ``String`` column."""
        import numpy as np
        import pyarrow as pa

        column = self._raw.columns[index]
        n = int(self._raw.count)
        if kind == Kind.INT:
            return np.frombuffer(ffi.buffer(column.values, 8 * n), dtype=np.int64).copy()
        if kind == Kind.FLOAT:
            return np.frombuffer(ffi.buffer(column.values, 8 * n), dtype=np.float64).copy()
        if kind == Kind.BOOL:
            return np.frombuffer(ffi.buffer(column.values, n), dtype=np.uint8).astype(bool)
        string_view = _string_view_type()
        if n > 0 and string_view is not None:
            views = column_string_views(self._raw.columns + index, n)
            if views is not None:
                buffers = [None, pa.py_buffer(views[0])]
                if views[1]:
                    values = ffi.cast("uint8_t *", column.values)
                    buffers.append(pa.py_buffer(ffi.buffer(values, views[1])[:]))
                return pa.Array.from_buffers(string_view, n, buffers)
        offsets = np.frombuffer(ffi.buffer(column.offsets, 8 * (n + 1)), dtype=np.uint64).astype(
            np.int64
        )
        data = ffi.buffer(ffi.cast("uint8_t *", column.values), int(offsets[-1]))[:]
        return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def column_string_views(column: Any, count: int) -> tuple[bytearray, int] | None:
    """``drt_column_string_views`` (ABI 1.12): the Arrow string views of the string
    column ``column`` (a ``drt_column *`` of a batch) of ``count`` (>= 1) rows, and how
    many bytes of its values they point into (0: every value inline); None when they do
    not fit Arrow's 32-bit view fields (use the offsets)."""
    views = bytearray(16 * count)
    data_len = ffi.new("uint64_t *")
    target = ffi.from_buffer(views)
    status = lib.drt_column_string_views(column, count, target, len(views), data_len)
    if status == Status.E_OVERFLOW:
        return None
    check(status)
    return views, int(data_len[0])


@functools.cache
def _string_view_type() -> Any:
    """pyarrow's ``string_view`` type when this pyarrow builds such an array from a views
    buffer and a data buffer and Polars reads it back (pyarrow 16 to 18 have the type but
    refuse the data buffer; 20 and later take it), else None: string columns then go to
    Polars as ``large_string``. Probed once, with one value too long to be inline."""
    import pyarrow as pa

    if not hasattr(pa, "string_view"):
        return None
    value = b"sixteen bytes ok"
    try:
        import polars as pl

        kind = pa.string_view()
        views = struct.pack("<i4sii", len(value), value[:4], 0, 0)
        array = pa.Array.from_buffers(kind, 1, [None, pa.py_buffer(views), pa.py_buffer(value)])
        if pl.Series(array).to_list() != [value.decode()]:
            return None
    except Exception:  # any refusal: use the offsets
        return None
    return kind


def batch_copy_payloads(batch: Batch, destination: Any) -> int:
    """``drt_batch_copy_payloads`` (ABI 1.5): ``batch``'s payloads back to back into the
    writable buffer ``destination`` (e.g. a ``numpy.uint8`` array); returns the bytes
    they take. Raises ``InvalidArgumentError`` (nothing copied) when they do not fit."""
    length = ffi.new("uint64_t *")
    target = ffi.from_buffer("uint8_t[]", destination, require_writable=True)
    check(lib.drt_batch_copy_payloads(batch._raw, target, len(target), length))
    return int(length[0])


def batch_run(batch: Batch) -> tuple[int, int, int]:
    """``drt_batch_run`` (ABI 1.13): ``(cache_id, first, length)``: ``batch``'s first
    ``length`` samples are samples ``first, first + 1, ...`` of cache ``cache_id`` (all 0
    for an empty batch). ``length == count``: the whole batch is rows ``first .. first +
    count`` of that cache's ``metadata.arrow`` (see :meth:`Lookup.stored_rows`)."""
    out = ffi.new("uint64_t[3]")
    check(lib.drt_batch_run(batch._raw, out, out + 1, out + 2))
    return int(out[0]), int(out[1]), int(out[2])


class Iterator(_Handle):
    """``drt_iter``: reads a window (or explicit positions) of a dataset's stream."""

    __slots__ = ("_batch",)
    _destroy = staticmethod(_destructor(lib.drt_iter_close))

    def __init__(self, pointer: Any, dataset: Dataset) -> None:
        super().__init__(pointer, keep=dataset)  # (a remote dataset's callbacks)
        self._batch = ffi.new("drt_batch *")

    @classmethod
    def open(cls, dataset: Dataset) -> Iterator:
        """``drt_iter_open``: reserve the dataset's next window and start reading."""
        out = ffi.new("drt_iter **")
        check(lib.drt_iter_open(dataset._ptr, out))
        return cls(out[0], dataset)

    @classmethod
    def open_range(cls, dataset: Dataset, positions: IterRange) -> Iterator:
        """``drt_iter_open_range``: read explicit stream positions (the dataset's own
        position is neither read nor moved)."""
        native = ffi.new("drt_iter_range *", positions._asdict())
        out = ffi.new("drt_iter **")
        check(lib.drt_iter_open_range(dataset._ptr, native, out))
        return cls(out[0], dataset)

    def window(self) -> IterRange:
        """``drt_iter_window``: the positions this iterator reads."""
        out = ffi.new("drt_iter_range *")
        check(lib.drt_iter_window(self._ptr, out))
        return IterRange(int(out.start), int(out.count), int(out.block_len), int(out.block_stride))

    def next_batch(self, max_count: int, flags: int = 0) -> Batch:
        """``drt_iter_next_batch``: the next up to ``max_count`` samples; ``count`` 0 at
        the end. The batch is valid until the next call or close."""
        check(lib.drt_iter_next_batch(self._ptr, max_count, flags, self._batch))
        return Batch(self._batch)

    def next_batch_into(self, max_count: int, flags: int, destination: Any) -> tuple[Batch, bool]:
        """``drt_iter_next_batch_into`` (ABI 1.7): the next contiguous batch (as
        ``next_batch`` with ``BatchFlag.CONTIGUOUS``), its payloads placed in the writable
        buffer ``destination`` (e.g. a ``numpy.uint8`` array) when they all fit there.
        Returns the batch and whether they did (its ``payload_base`` is then
        ``destination``'s first byte; else the iterator's buffer, as ``next_batch``)."""
        target = ffi.from_buffer("uint8_t[]", destination, require_writable=True)
        raw = self._batch
        check(lib.drt_iter_next_batch_into(self._ptr, max_count, flags, target, len(target), raw))
        placed = len(target) > 0 and raw.payload_base == ffi.cast("uint8_t *", target)
        return Batch(raw), bool(placed)

    def stage_batch(self, max_count: int, destination: Any) -> int:
        """``drt_iter_stage_batch`` (ABI 1.14): lets a worker place the payloads of the
        next ``next_batch_into(max_count, flags, destination)`` batch in the writable
        buffer ``destination`` now (None: only ask). Returns the bytes it needs for
        that (0: the batch cannot be staged); nothing is staged when ``destination`` is
        shorter. While staged, the caller keeps ``destination`` alive and untouched until
        its next call on the iterator returns or the iterator is closed."""
        if destination is None:
            target, size = ffi.NULL, 0
        else:
            target = ffi.from_buffer("uint8_t[]", destination, require_writable=True)
            size = len(target)
        needed = ffi.new("uint64_t *")
        check(lib.drt_iter_stage_batch(self._ptr, max_count, target, size, needed))
        return int(needed[0])

    def give_payload_buffers(self, buffers: Sequence[Any], reset: bool) -> tuple[int, int]:
        """``drt_iter_give_payload_buffers`` (ABI 1.9): ``buffers`` (objects with the
        buffer protocol, kept alive and untouched by the caller as the C function says)
        for the payloads read next, after dropping the unassigned ones with ``reset``.
        Returns ``(taken, budget)``: the buffers assigned so far, the byte budget. See
        :class:`PayloadBuffers`."""
        pointers = ffi.new("uint8_t *[]", [ffi.from_buffer("uint8_t[]", b) for b in buffers])
        lens = ffi.new("uint64_t[]", [len(b) for b in buffers])
        flags = int(lib.DRT_PAYLOAD_BUFFERS_RESET) if reset else 0
        out = ffi.new("uint64_t[2]")
        check(
            lib.drt_iter_give_payload_buffers(
                self._ptr, pointers, lens, len(buffers), flags, out, out + 1
            )
        )
        return int(out[0]), int(out[1])


# ``PyBytes_FromStringAndSize(NULL, n)``: a ``bytes`` of ``n`` bytes left uninitialized,
# for its maker to fill before anyone else sees it (CPython's own contract for it). A
# function object of our own, so no other user of ``ctypes.pythonapi`` is affected.
# CPython only (``ctypes.pythonapi``): elsewhere large payloads are copied as before.
_new_bytes: Any = None
if hasattr(ctypes, "pythonapi"):
    _new_bytes = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t)(
        ("PyBytes_FromStringAndSize", ctypes.pythonapi)
    )


class PayloadBuffers:
    """``drt_iter_give_payload_buffers`` (ABI 1.9) for one iterator: ``bytes`` objects,
    made uninitialized, that the iterator reads large payloads straight into (one copy,
    by its I/O backend), handed to the caller as they are.

    Contract: a given object is seen by no one else until the batch that holds its
    payload (the sample's payload pointer is its address) is delivered; ``take`` then
    returns it. The iterator assigns the buffers in the order given, so the assigned
    ones come back in that order: those not yet delivered are the front of ``_given``,
    those not yet assigned its back. The objects stay referenced here until delivered or
    dropped unassigned, so their memory outlives any read into it as long as the
    iterator is closed before this object is dropped (``CachedDataset`` closes it in the
    generator's ``finally``, while the generator's frame still holds this object).
    Memory: at most the iterator's byte budget (or one buffer) of them given at a time."""

    __slots__ = ("_budget", "_given", "_iterator", "_length", "_popped")

    def __init__(self, iterator: Iterator) -> None:
        self._iterator = iterator
        self._given: deque[tuple[int, bytes]] = deque()  # (address, object), in order
        self._length = 0  # the length of the unassigned ones
        # Buffers delivered (taken from the front), counted like the iterator's count of
        # those assigned: over its whole life, so from what an earlier object of this
        # iterator left (all delivered or dropped then; none given now).
        self._popped, self._budget = iterator.give_payload_buffers([], False)

    @property
    def pending(self) -> bool:
        """Whether any buffer is given and not yet delivered."""
        return bool(self._given)

    def take(self, address: int) -> bytes | None:
        """The buffer holding the payload at ``address`` (the first one given and not yet
        delivered), or None: that payload is elsewhere."""
        given = self._given
        if given and given[0][0] == address:
            self._popped += 1
            return given.popleft()[1]
        return None

    def take_run(self, starts: list[int]) -> list[bytes] | None:
        """The buffers holding the payloads at ``starts`` when they are the next ones
        given and not yet delivered, in order (taken); else None and nothing taken."""
        given = self._given
        n = len(starts)
        if len(given) < n:
            return None
        front = list(islice(given, n))
        if list(map(itemgetter(0), front)) != starts:
            return None
        for _ in range(n):
            given.popleft()
        self._popped += n
        return list(map(itemgetter(1), front))

    def _give(self, objects: list[bytes], reset: bool) -> int:
        """Gives ``objects``; returns the buffers assigned so far."""
        taken, self._budget = self._iterator.give_payload_buffers(objects, reset)
        return taken

    def top_up(self, length: int, ahead_bytes: int) -> None:
        """Keeps buffers of ``length`` bytes (0: none) given to the iterator and not yet
        delivered: ``ahead_bytes`` of them (at least 2), fewer when its byte budget holds
        fewer (at least one), replacing unassigned ones of another length. While it has
        buffers, the iterator reads no further ahead than they reach (records that would
        take one wait for them), so they are also its read-ahead."""
        given = self._given
        if 0 < length == self._length and self._budget > 0 and _new_bytes is not None:
            # Records alike (the usual case): any unassigned buffers have this length, so
            # none is dropped and the assigned ones need not be counted; one call (none
            # when nothing was delivered) gives the new ones. The budget is fixed.
            self._give_new(length, self._wanted(length, ahead_bytes), False)
            return
        taken = self._give([], False)
        unassigned = self._popped + len(given) - taken
        # Length 0 always resets: the iterator then stops waiting for buffers.
        reset = length <= 0 or (unassigned > 0 and self._length != length)
        if reset:
            for _ in range(unassigned):
                given.pop()
        wanted = 0 if length <= 0 or _new_bytes is None else self._wanted(length, ahead_bytes)
        if wanted <= 0:
            if reset:
                self._give([], True)
            return
        self._give_new(length, wanted, reset)

    def _wanted(self, length: int, ahead_bytes: int) -> int:
        """How many buffers of ``length`` bytes to add to those given (see ``top_up``)."""
        count = max(2, ahead_bytes // length)
        return min(count, max(1, self._budget // length)) - len(self._given)

    def _give_new(self, length: int, wanted: int, reset: bool) -> None:
        """Makes ``wanted`` new buffers of ``length`` bytes (none when it is not
        positive) and gives them, after dropping the unassigned ones with ``reset``."""
        if wanted <= 0:
            return
        objects = [_new_bytes(None, length) for _ in range(wanted)]
        self._give(objects, reset)
        self._length = length
        self._given.extend((int(ffi.cast("uintptr_t", ffi.from_buffer(o))), o) for o in objects)


class Lookup(_Handle):
    """``drt_lookup``: random access to a dataset's samples by identity."""

    __slots__ = ("_batch", "_ids", "_row_buffer")
    _destroy = staticmethod(_destructor(lib.drt_lookup_close))

    def __init__(self, pointer: Any, dataset: Dataset) -> None:
        super().__init__(pointer, keep=dataset)  # (a remote dataset's callbacks)
        # Call buffers reused by every single-sample get().
        self._ids = ffi.new("uint64_t[2]")
        self._batch = ffi.new("drt_batch *")
        # The registered row buffer's cffi pointer (it keeps the memory alive as long as
        # the handle, which borrows it); None until set_row_buffer.
        self._row_buffer: Any = None

    @classmethod
    def open(cls, dataset: Dataset) -> Lookup:
        """``drt_lookup_open``."""
        out = ffi.new("drt_lookup **")
        check(lib.drt_lookup_open(dataset._ptr, out))
        return cls(out[0], dataset)

    def get(self, cache_ids: Sequence[int], sample_ids: Sequence[int], flags: int = 0) -> Batch:
        """``drt_lookup_get``: the samples ``(cache_ids[i], sample_ids[i])`` in order
        (IndexError for unknown ones). The batch is valid until the next call or close."""
        count = len(cache_ids)
        if count != len(sample_ids):
            raise ValueError("cache_ids and sample_ids must have the same length")
        if count == 1:
            ids = self._ids
            ids[0] = cache_ids[0]
            ids[1] = sample_ids[0]
            first, second = ids, ids + 1
        else:
            first = ffi.new("uint64_t[]", list(cache_ids))
            second = ffi.new("uint64_t[]", list(sample_ids))
        check(lib.drt_lookup_get(self._ptr, count, first, second, flags, self._batch))
        return Batch(self._batch, self)

    def get_arrays(self, cache_ids: Any, sample_ids: Any, flags: int = 0) -> Batch:
        """``drt_lookup_get`` for identities given as two C-contiguous numpy uint64 arrays
        of the same length, passed by pointer (no copy). The batch is valid until the next
        call or close."""
        count = len(cache_ids)
        first = ffi.from_buffer("uint64_t[]", cache_ids)
        second = ffi.from_buffer("uint64_t[]", sample_ids)
        check(lib.drt_lookup_get(self._ptr, count, first, second, flags, self._batch))
        return Batch(self._batch, self)

    def stored_rows(self, cache_id: int, first: int, count: int) -> Batch:
        """``drt_lookup_stored_rows`` (ABI 1.13): rows ``first .. first + count`` of cache
        ``cache_id``'s ``metadata.arrow`` as a batch (identities and metadata columns,
        empty payloads, no record read), up to the cache's last sample or the first row
        that holds an Arrow null (``count`` may be smaller). IndexError for a cache or a
        sample ``first`` that does not exist.
        Valid like :meth:`get`'s batch."""
        check(lib.drt_lookup_stored_rows(self._ptr, cache_id, first, count, self._batch))
        return Batch(self._batch)

    def get_row(self, cache_id: int, sample_id: int, destination: Any) -> int:
        """``drt_lookup_get_row`` (ABI 1.6): one sample packed into the writable buffer
        ``destination`` (at least 8 bytes); returns its packed size, which is all that
        was written when it exceeds ``len(destination)``. ``get_item`` calls
        ``drt_lookup_row`` (the same bytes) from the closure :func:`row_getter` makes."""
        target = ffi.from_buffer("uint8_t[]", destination, require_writable=True)
        check(lib.drt_lookup_get_row(self._ptr, cache_id, sample_id, target, len(target)))
        return int(struct.unpack_from("<Q", destination)[0])

    def set_row_buffer(self, size: int) -> memoryview:
        """``drt_lookup_set_row_buffer`` (ABI 1.11): registers a new zeroed row buffer of
        ``size`` (>= 8) bytes for ``drt_lookup_row`` and returns a view of it. The lookup
        keeps the buffer alive until another is registered or the handle is closed."""
        row = bytearray(size)
        pointer = ffi.from_buffer("uint8_t[]", row)
        check(lib.drt_lookup_set_row_buffer(self._ptr, pointer, size))
        self._row_buffer = pointer
        return memoryview(row)

    def row(self, cache_id: int, sample_id: int) -> int:
        """``drt_lookup_row`` (ABI 1.11): :meth:`get_row` into the registered row buffer;
        returns the packed size (all that was written when it exceeds the buffer).
        ``get_item`` calls the C function from the closure :func:`row_getter` makes."""
        size = int(lib.drt_lookup_row(self._ptr, cache_id, sample_id))
        check(min(0, size))
        return size


#: A row reader's initial buffer (a sample of up to about this size needs one call).
_ROW_BUFFER_BYTES = 64 << 10

#: Not a native status nor a row size: cffi refused an argument of a row getter (see
#: ``_row_failure``).
_REFUSED = 0


def _row_failure(
    status: int, refusal: Callable[[Any, Any], Exception], cache_id: Any, sample_id: Any
) -> NoReturn:
    """Raise a row getter's failure: ``refusal``'s exception for arguments cffi refused
    (``_REFUSED``, raised outside the ``OverflowError`` handler so it has no context, as
    ``get_item``'s own checks), else the native status's."""
    if status == _REFUSED:
        raise refusal(cache_id, sample_id)
    raise_status(status)


def row_getter(
    lookup: Lookup,
    lock: Any,
    names: Sequence[str],
    kinds: Sequence[int],
    sample_type: type,
    refusal: Callable[[Any, Any], Exception],
) -> Callable[[int, int], Any]:
    """A function ``(cache_id, sample_id) -> sample_type(payload, metadata dict,
    cache_id, sample_id)`` reading through ``lookup`` while holding ``lock``:
    ``drt_lookup_row`` (ABI 1.11: ``drt_lookup_get_row``'s bytes, values and errors, with
    three call arguments, into the row buffer registered on ``lookup``), unpacked
    (``kinds`` plain ints, schema order) with one precompiled ``Struct.unpack_from`` for
    the payload length and every field's slot, then the payload and string bytes. A
    sample larger than the buffer is read again into a grown one (registered and kept
    for later calls). The function registers the lookup's row buffer: nothing else may
    use ``drt_lookup_row`` on it.

    The payload and string bytes: rows of one shape (payload length and every string's
    length) are the common case (fixed-size records, constant strings), so once two rows
    in a row had the same shape, one precompiled unpack for that shape
    (``_shape_unpacker``) makes the header's values and the ``bytes`` objects in one C
    call (then one ``decode`` per string); a row whose header says another shape (its
    bytes taken by that unpack are dropped: the buffer never shrinks, so the unpack stays
    inside it) is cut out with memoryview slices. Both give equal values.

    Argument errors are ``get_item``'s: ``TypeError`` unless both are ``int``, and for an
    ``int`` that does not fit in 64 bits unsigned (cffi refuses it with ``OverflowError``
    before any native call) the exception ``refusal(cache_id, sample_id)`` returns.
    ``sample_type`` is a tuple subclass of four fields, built without calling it.

    Generated once per dataset with the names as constants (they enter the source only
    through ``repr``, so any string is safe) and everything it uses bound in its closure:
    one Python frame, one C call, no attribute lookups, no loop, no list. The lookup's
    handle must stay open while the function is used."""
    codes = {int(Kind.INT): "q", int(Kind.FLOAT): "d", int(Kind.BOOL): "Q", int(Kind.STRING): "Q"}
    # The packed size (8 bytes) is skipped: drt_lookup_row returns it.
    layout = "<8xQ" + "".join(codes[int(kind)] for kind in kinds)
    header = 16 + 8 * len(kinds)
    slots = ", ".join(["n", *(f"v{i}" for i in range(len(kinds)))])
    strings = [i for i, kind in enumerate(kinds) if int(kind) == int(Kind.STRING)]
    # The shape of a row: its payload length and string lengths (as `shape` spells it).
    shape = "(" + "".join(f"{v}, " for v in ["n", *(f"v{i}" for i in strings)]) + ")"
    same = " and ".join(["n == _n", *(f"v{i} == _m{i}" for i in strings)])
    lines = [
        "def build(_lock, _ptr, _sample_type, _refusal, _grow, view, capacity):",
        # Until a shape repeats: the header's values and empty bytes, which `same` refuses.
        f"    _shaped = _shape_unpacker({layout!r}, {tuple(0 for _ in range(1 + len(strings)))!r})",
        "    _missed = None",
        "    _n = " + " = ".join(f"_m{i}" for i in strings) + (" = " if strings else "") + "-1",
        "    def get_row(cache_id, sample_id):",
        "        nonlocal view, capacity, _shaped, _missed, "
        + ", ".join(["_n", *(f"_m{i}" for i in strings)]),
        "        if type(cache_id) is not int or type(sample_id) is not int:",
        "            raise TypeError('cache_id and sample_id must be integers')",
        # A with statement: an interrupt (Ctrl-C) right after an acquire() call, before
        # its try began, left the lock held and every later get_item blocked.
        "        with _lock:",
        "            try:",
        "                size = _row(_ptr, cache_id, sample_id)",
        "            except OverflowError:",
        "                size = _REFUSED",
        "            if not 0 < size <= capacity:",
        "                if size <= 0:",
        "                    _fail(size, _refusal, cache_id, sample_id)",
        "                view = _grow(size)",
        "                capacity = size",
        "                _check(min(0, _row(_ptr, cache_id, sample_id)))",
        f"            {slots}, data, " + "".join(f"b{i}, " for i in strings) + "= _shaped(view)",
        f"            if {same}:",
    ]
    lines += [f"                s{i} = b{i}.decode()" for i in strings]
    if not strings:
        lines.append("                pass")
    lines += [
        "            else:",
        f"                at = {header} + n",
        f"                data = view[{header}:at].tobytes()",
    ]
    for i in strings:
        lines.append(f"                s{i} = str(view[at:at + v{i}], 'utf-8')")
        lines.append(f"                at += v{i}")
    lines += [
        f"                if {shape} == _missed:",
        f"                    _shaped = _shape_unpacker({layout!r}, {shape})",
        "                    " + " = ".join(["_n", "n"]),
    ]
    lines += [f"                    _m{i} = v{i}" for i in strings]
    lines += [
        f"                _missed = {shape}",
    ]
    values = []
    for i, (name, kind) in enumerate(zip(names, kinds)):
        if int(kind) == int(Kind.STRING):
            values.append(f"{name!r}: s{i}")
        elif int(kind) == int(Kind.BOOL):
            values.append(f"{name!r}: v{i} != 0")
        else:
            values.append(f"{name!r}: v{i}")
    lines.append(
        f"        return _new(_sample_type, (data, {{{', '.join(values)}}}, cache_id, sample_id))"
    )
    lines.append("    return get_row")
    namespace: dict[str, Any] = {
        "_row": lib.drt_lookup_row,
        "_fail": _row_failure,
        "_REFUSED": _REFUSED,
        "_check": check,
        "_new": tuple.__new__,
        "_shape_unpacker": _shape_unpacker,
    }
    exec(compile("\n".join(lines) + "\n", "<dataset_rt row getter>", "exec"), namespace)
    build = namespace["build"]
    return build(  # type: ignore[no-any-return]
        lock,
        lookup._ptr,
        sample_type,
        refusal,
        lookup.set_row_buffer,
        lookup.set_row_buffer(_ROW_BUFFER_BYTES),
        _ROW_BUFFER_BYTES,
    )


@functools.lru_cache(maxsize=64)
def _shape_unpacker(layout: str, shape: tuple[int, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The ``unpack_from`` of a packed row (``drt_lookup_get_row``) whose payload and
    string values have the lengths ``shape``: the values ``layout`` (its header's struct
    format) gives, then one ``bytes`` object per length."""
    return struct.Struct(layout + "".join(f"{length}s" for length in shape)).unpack_from


_INT, _FLOAT, _BOOL = int(Kind.INT), int(Kind.FLOAT), int(Kind.BOOL)


@functools.lru_cache(maxsize=8)
def _equal_payloads(length: int, count: int) -> struct.Struct:
    """The unpacker of ``count`` back-to-back payloads of ``length`` bytes each into
    ``bytes`` objects (compiled once: batches of equal-sized records repeat a shape)."""
    return struct.Struct(f"{length}s" * count)


def _same_u64(pointer: Any, n: int) -> int | None:
    """The value of the ``n`` (>= 1) ``uint64_t`` at ``pointer`` when they are all equal,
    else None: one comparison of their bytes, no int object per value."""
    words = ffi.buffer(pointer, 8 * n)[:]
    first = words[:8]
    return int.from_bytes(first, sys.byteorder) if words == first * n else None


@functools.lru_cache(maxsize=8)
def _progression(step: int, n: int) -> bytes:
    """``0, step, ..., step * n`` as native-endian ``uint64_t`` bytes: the offsets of ``n``
    string values of ``step`` bytes each (batches of one shape repeat it)."""
    return array("Q", range(0, step * n + 1, step)).tobytes()


def _column_values(column: Any, kind: int, n: int) -> list[Any]:
    """The ``n`` values of a batch column (plain-int ``kind``) as Python values. A string
    column whose values are all equal (a constant field, common in metadata) is one
    ``str`` object ``n`` times: equal values, without a decode and a slice per row."""
    if kind == _INT:
        return ffi.unpack(ffi.cast("int64_t *", column.values), n)
    if kind == _FLOAT:
        return ffi.unpack(ffi.cast("double *", column.values), n)
    if kind == _BOOL:
        return ffi.unpack(ffi.cast("_Bool *", column.values), n)
    # The offsets as bytes first: a constant column is recognised by two byte comparisons,
    # without an int object per row.
    offset_bytes = ffi.buffer(column.offsets, 8 * (n + 1))[:]
    end = int.from_bytes(offset_bytes[-8:], sys.byteorder)
    if end == 0:
        return [""] * n
    data = ffi.buffer(ffi.cast("uint8_t *", column.values), end)[:]
    step = int.from_bytes(offset_bytes[8:16], sys.byteorder)
    if step * n == end and offset_bytes == _progression(step, n):
        # Values of one length: all equal to the first when `data` is n copies of it.
        first = data[:step]
        if data == first * n:
            return [first.decode("utf-8")] * n
    offsets = ffi.unpack(column.offsets, n + 1)
    if data.isascii():
        # One decode; byte offsets are character offsets.
        text = data.decode("ascii")
        return list(map(text.__getitem__, map(slice, offsets, offsets[1:])))
    return [data[a:b].decode("utf-8") for a, b in pairwise(offsets)]


# ---------------------------------------------------------------- writing


class WriterOptions(NamedTuple):
    """``drt_writer_options``."""

    max_shard_bytes: int
    prefetch_size: int
    compression: Compression
    compression_ratio: float
    flags: WriterFlag = WriterFlag(0)
    fingerprint: str | None = None


class StageStats(NamedTuple):
    """``drt_stage_stats`` of one writer stage."""

    stage: Stage
    calls: int
    total_ns: int
    bytes: int


class Writer(_Handle):
    """``drt_writer``: writes one cache through a staging directory.

    Every failing call raises ``error(message)``, ``error`` given at :meth:`open` (the
    writer reports failures as per-source values), or the mapped exception without it."""

    __slots__ = ("_error",)
    _destroy = staticmethod(_destructor(lib.drt_writer_close))

    def __init__(self, pointer: Any, error: ErrorFactory | None) -> None:
        super().__init__(pointer)
        self._error = error

    @classmethod
    def open(
        cls,
        runtime: Runtime,
        base_dir: str | os.PathLike[str],
        name: str,
        options: WriterOptions,
        *,
        error: ErrorFactory | None = None,
    ) -> Writer:
        """``drt_writer_open``: start writing ``<base_dir>/<name>``."""
        native_options = ffi.new(
            "drt_writer_options *",
            {
                "max_shard_bytes": options.max_shard_bytes,
                "prefetch_size": options.prefetch_size,
                "compression": int(options.compression),
                "compression_ratio": options.compression_ratio,
                "flags": int(options.flags),
            },
        )
        fingerprint = (
            options.fingerprint.encode("utf-8") if options.fingerprint is not None else None
        )
        if fingerprint is not None:
            native_options.fingerprint = ffi.from_buffer(fingerprint)
            native_options.fingerprint_len = len(fingerprint)
        base_bytes = encode_path(base_dir)
        name_bytes = name.encode("utf-8")
        out = ffi.new("drt_writer **")
        status = lib.drt_writer_open(
            runtime._owned(),
            base_bytes,
            len(base_bytes),
            name_bytes,
            len(name_bytes),
            native_options,
            out,
        )
        check(status, error)
        return cls(out[0], error)

    def set_schema(self, names: Sequence[str], kinds: Sequence[int]) -> None:
        """``drt_writer_set_schema``: ``names`` sorted by their UTF-8 bytes."""
        fields = ffi.new("drt_field[]", len(names))
        encoded = [name.encode("utf-8") for name in names]
        for field, name, kind in zip(fields, encoded, kinds):
            field.name.ptr = ffi.from_buffer(name)
            field.name.len = len(name)
            field.kind = kind
        check(lib.drt_writer_set_schema(self._ptr, fields, len(names)), self._error)

    def append(
        self,
        count: int,
        payloads: Any,
        payload_offsets: Any,
        columns: Sequence[tuple[int, Any, Any]],
    ) -> None:
        """``drt_writer_append``: ``count`` samples, passed by pointer (the library copies
        them before returning).

        ``payloads`` is a buffer of payload bytes, ``payload_offsets`` a C-contiguous
        numpy uint64 array of ``count + 1`` offsets into it; ``columns`` holds one
        ``(kind, values, offsets)`` per schema field: ``values`` a buffer (a numpy array;
        UTF-8 bytes for strings), ``offsets`` a numpy uint64 array for strings, else
        None."""
        native = ffi.new("drt_column[]", max(1, len(columns)))
        for entry, (kind, values, offsets) in zip(native, columns):
            entry.kind = kind
            entry.values = ffi.from_buffer(values)
            if offsets is not None:
                entry.offsets = ffi.from_buffer("uint64_t[]", offsets)
        status = lib.drt_writer_append(
            self._ptr,
            count,
            ffi.from_buffer(payloads),
            ffi.from_buffer("uint64_t[]", payload_offsets),
            native,
        )
        check(status, self._error)

    def stats(self) -> list[StageStats]:
        """``drt_writer_stats``: every stage's timings, in ``Stage`` order."""
        out = ffi.new("drt_stage_stats[]", STAGE_COUNT)
        check(lib.drt_writer_stats(self._ptr, out), self._error)
        return [
            StageStats(Stage(i), int(s.calls), int(s.total_ns), int(s.bytes))
            for i, s in enumerate(out)
        ]

    def sample_count(self) -> int:
        """``drt_writer_sample_count``: samples appended so far."""
        out = ffi.new("uint64_t *")
        check(lib.drt_writer_sample_count(self._ptr, out), self._error)
        return int(out[0])

    def staging_path(self) -> str:
        """``drt_writer_staging_path``: where to write ``metadata.arrow``."""
        out = ffi.new("drt_str *")
        check(lib.drt_writer_staging_path(self._ptr, out), self._error)
        return os.fsdecode(_text(out))

    def finish(self) -> None:
        """``drt_writer_finish``: complete and publish the cache."""
        check(lib.drt_writer_finish(self._ptr), self._error)


class Commit(_Handle):
    """``drt_commit``: turns fragments into one published cache. Failing calls raise as
    :class:`Writer`'s do."""

    __slots__ = ("_error",)
    _destroy = staticmethod(_destructor(lib.drt_commit_close))

    def __init__(self, pointer: Any, error: ErrorFactory | None) -> None:
        super().__init__(pointer)
        self._error = error

    @classmethod
    def open(
        cls,
        base_dir: str | os.PathLike[str],
        name: str,
        fragments: Sequence[str | os.PathLike[str]],
        flags: int = 0,
        *,
        error: ErrorFactory | None = None,
    ) -> Commit:
        """``drt_commit_open``: verify ``fragments`` and stage them as
        ``<base_dir>/<name>``."""
        strs = PathArray(fragments)
        base_bytes = encode_path(base_dir)
        name_bytes = name.encode("utf-8")
        options = ffi.new("drt_commit_options *", {"flags": int(flags)})
        out = ffi.new("drt_commit **")
        status = lib.drt_commit_open(
            base_bytes,
            len(base_bytes),
            name_bytes,
            len(name_bytes),
            strs.array,
            strs.count,
            options,
            out,
        )
        check(status, error)
        return cls(out[0], error)

    def sample_count(self) -> int:
        """``drt_commit_sample_count``."""
        out = ffi.new("uint64_t *")
        check(lib.drt_commit_sample_count(self._ptr, out), self._error)
        return int(out[0])

    def staging_path(self) -> str:
        """``drt_commit_staging_path``: where to write the merged ``metadata.arrow``."""
        out = ffi.new("drt_str *")
        check(lib.drt_commit_staging_path(self._ptr, out), self._error)
        return os.fsdecode(_text(out))

    def finish(self) -> None:
        """``drt_commit_finish``: check ``metadata.arrow``, publish the cache."""
        check(lib.drt_commit_finish(self._ptr), self._error)
