"""Frozen pydantic configuration models for writing and reading caches.

Contract: the fields, defaults, constraints, coercions and error types of these models
match dataset-rt 0.4.8 exactly. `ShardCompression` and `WriterProfilerConfig` ignore
unknown keys; `WriterConfig` and `ReaderConfig` reject them (`extra_forbidden`).
Every model is frozen, so instances are hashable, compare by value and pickle.

Extension fields (ours, not the reference's) are listed in each model's `_extension_defaults`.
At their defaults they are invisible: `repr`/`str`, `model_dump`/`model_dump_json`
and pickles look exactly like the reference release's, so `dataset.json` files and
pickles written by this package load in dataset-rt 0.4.8. Equality and hashing still see
them.

This module deliberately does not use `from __future__ import annotations`: public
classes report `__module__ == "dataset_rt.api"`, and real (non-string) annotations
mean pydantic never has to resolve a name in that facade module while it is still being
imported.
"""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    DirectoryPath,
    Field,
    PositiveInt,
    SerializerFunctionWrapHandler,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_serializer,
)

__all__ = [
    "DEFAULT_SHARD_COMPRESSION",
    "DEFAULT_WRITER_CONFIG",
    "DEFAULT_WRITER_PROFILER_CONFIG",
    "CompressionAlgo",
    "IoBackend",
    "ReaderConfig",
    "ShardCompression",
    "WriterConfig",
    "WriterProfilerConfig",
]

# Pickles and reprs name the stable facade, as the reference's do, so a pickle
# written by either implementation loads in the other.
_PUBLIC_MODULE = "dataset_rt.api"

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: Any) -> bool:
    """Whether ``path`` is an object store URL (``scheme://...``, not ``file://``): such a
    cache path names a cache on object storage (``dataset_rt.remote``), as the core
    decides for the same strings."""
    return isinstance(path, str) and bool(_URL.match(path)) and not path.startswith("file://")


def _url_or_directory(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A URL string as it is (a cache on object storage); anything else as
    ``DirectoryPath`` validates it, with its messages."""
    return value if is_url(value) else handler(value)


# A cache path of `dataset.json`: an existing directory (the reference's rule and
# messages) or an object store URL, kept as a string.
CachePath: TypeAlias = Annotated[DirectoryPath, WrapValidator(_url_or_directory)]

CompressionAlgo: TypeAlias = Literal["none", "lz4"]
"""Per-record payload compression of new shards."""

IoBackend: TypeAlias = Literal["auto", "io_uring", "threads"]
Sampling: TypeAlias = Literal["with_replacement", "permutation"]
OnStale: TypeAlias = Literal["error", "rebuild"]
"""Read I/O backend: `auto` probes io_uring once and falls back to threads."""

DATASET_CONFIG_VERSION: Literal[2] = 2
"""The only `dataset.json` version written and accepted (reference section 2.8)."""

DATASET_METADATA_FILE: Literal["metadata.arrow"] = "metadata.arrow"
"""Name of the active-table Arrow file next to `dataset.json`."""


class ShardCompression(BaseModel):
    """Compression policy for payload shards.

    `algo="none"` stores payloads as given and needs `ratio == 1.0`; `"lz4"` stores
    each record as one size-prepended LZ4 block. `ratio` is advisory: it is recorded in
    the manifest and must be positive. pydantic only checks `ratio > 0` (it accepts
    `inf`); the native writer re-validates at write time and raises `ValueError` for a
    non-finite ratio or for `algo="none"` with a ratio other than 1.0. Unknown keys are
    ignored.
    """

    __module__ = _PUBLIC_MODULE

    model_config = ConfigDict(frozen=True)

    algo: CompressionAlgo = Field(
        default="none",
        description="Compression applied to each payload record independently.",
    )
    ratio: float = Field(
        default=1.0,
        gt=0.0,
        description="Advisory expected compression ratio; exactly 1.0 for 'none'.",
    )


DEFAULT_SHARD_COMPRESSION = ShardCompression()
"""The uncompressed default; `WriterConfig().shard_compression` is this object."""


class WriterProfilerConfig(BaseModel):
    """Optional writer-stage profiling.

    Disabled by default. When enabled, the writer saves a JSON timing summary at `path`
    after a write finishes or fails in a handled way. Enabling it forces serial writing.
    Unknown keys are ignored.
    """

    __module__ = _PUBLIC_MODULE

    model_config = ConfigDict(frozen=True)

    enabled: bool = Field(
        default=False,
        description="Whether writer-stage timings are collected and saved.",
    )
    path: Path = Field(
        default=Path("dataset_rt_profile.json"),
        description="Where the JSON timing summary is written when enabled.",
    )


DEFAULT_WRITER_PROFILER_CONFIG = WriterProfilerConfig()
"""The default (disabled) profiler; `WriterConfig().profiler` is this object."""


class _WithExtensions(BaseModel):
    """Base of configs that carry this project's extension fields.

    Subclasses list them with their defaults in `_extension_defaults`. A field at its
    default is left out of `model_dump`/`model_dump_json`, repr/str and pickles, so
    whatever reads our output (dataset-rt 0.4.8, its pickles, `dataset.json`) sees
    exactly what the reference would have produced; a non-default value is kept.
    """

    _extension_defaults: ClassVar[dict[str, object]] = {}

    # No return annotation on purpose: pydantic would build the serialization JSON
    # schema from it (a bare object); without one, that schema stays the field-derived
    # schema, identical to the validation one. The serializer returns dict[str, Any].
    @model_serializer(mode="wrap")
    def _omit_default_extensions(  # type: ignore[no-untyped-def]
        self, handler: SerializerFunctionWrapHandler
    ):
        """Serialize like the reference: drop extension fields at their default."""
        data = handler(self)
        if isinstance(data, dict):
            for name, default in self._extension_defaults.items():
                if name in data and getattr(self, name) == default:
                    del data[name]
        return data

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """Yield repr fields, hiding extension fields that are at their default."""
        for name, value in super().__repr_args__():
            if name in self._extension_defaults and value == self._extension_defaults[name]:
                continue
            yield name, value

    def __getstate__(self) -> dict[Any, Any]:
        """Pickle without default-valued extension fields (reference-compatible)."""
        state = super().__getstate__()
        fields = state.get("__dict__")
        if isinstance(fields, dict) and any(
            name in fields and fields[name] == default
            for name, default in self._extension_defaults.items()
        ):
            state["__dict__"] = {
                name: value
                for name, value in fields.items()
                if not (
                    name in self._extension_defaults and value == self._extension_defaults[name]
                )
            }
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        """Restore a pickle, filling extension fields absent from older pickles."""
        fields = state.get("__dict__")
        if isinstance(fields, dict):
            missing = {
                name: default
                for name, default in self._extension_defaults.items()
                if name not in fields
            }
            if missing:
                state = {**state, "__dict__": {**fields, **missing}}
        super().__setstate__(state)


class WriterConfig(_WithExtensions):
    """How `DatasetRuntime.write_cache` and `from_cache_sources` write caches.

    `num_processes == 0` writes every source in the calling process; a positive value
    runs the sources in that many spawned child processes, each child bounded by
    `process_timeout_seconds` (finite and positive). Integer limits are only checked for
    `> 0` here; values that do not fit in 64 bits fail when the write starts. Unknown
    keys are rejected.
    """

    __module__ = _PUBLIC_MODULE

    model_config = ConfigDict(frozen=True, extra="forbid")
    _extension_defaults: ClassVar[dict[str, object]] = {"on_stale": "error"}

    num_processes: int = Field(
        default=0,
        ge=0,
        description="Spawned writer processes; 0 writes in the calling process.",
    )
    process_timeout_seconds: float = Field(
        default=3600.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Deadline in seconds for a child's startup or for one dispatched source; "
            "on expiry the pool stops and unfinished sources are reported as errors. "
            "Ignored when writing serially."
        ),
    )
    prefetch_size: int = Field(
        default=64,
        gt=0,
        description="Bound on writer tasks and results buffered between stages.",
    )
    max_shard_bytes: int = Field(
        default=64 * 1024 * 1024,
        gt=0,
        description="Shard size in bytes after which the writer starts a new shard.",
    )
    shard_compression: ShardCompression = Field(
        default=DEFAULT_SHARD_COMPRESSION,
        description="Compression policy for the payloads of new shards.",
    )
    show_progress: bool = Field(
        default=True,
        description=(
            "Whether write progress is shown on stderr: a live line per source when stderr "
            "is a terminal; with num_processes, a 'sources completed' line per source."
        ),
    )
    validate_cache: bool = Field(
        default=False,
        description="Whether a reused cache is checksum-verified before loading.",
    )
    profiler: WriterProfilerConfig = Field(
        default=DEFAULT_WRITER_PROFILER_CONFIG,
        description="Optional writer-stage profiler output.",
    )
    on_stale: OnStale = Field(
        default="error",
        description=(
            "Extension: what from_cache_sources does when a source's fingerprint differs "
            "from its existing cache's: 'error' reports a CacheWriteError and leaves the "
            "cache alone; 'rebuild' writes a new cache and swaps it in atomically."
        ),
    )


DEFAULT_WRITER_CONFIG = WriterConfig()
"""The object used as the `writer_config` default throughout the public API."""

# Extension fields of ReaderConfig and their defaults. At its default, a field listed
# here is left out of model_dump/model_dump_json, repr/str and pickles, so reference
# readers of our output see exactly what dataset-rt 0.4.8 would have written.
_READER_EXTENSION_DEFAULTS: dict[str, object] = {
    "io_backend": "auto",
    "sampling": "with_replacement",
    "prefetch_bytes": 0,
}


class ReaderConfig(_WithExtensions):
    """How a `CachedDataset` reads and samples.

    `seed` (required) drives the deterministic shuffle; it must fit in an unsigned
    64-bit integer when a dataset is built (checked there, not here). `prefetch_size`
    bounds the samples read ahead. `shuffle=False` walks the active rows in table order;
    `shuffle=True` draws with replacement, as dataset-rt 0.4.8 does: uniformly over the
    physical samples until the first `update_metadata`, then weighted by the active
    table (or, with `sampling="permutation"`, in permutation passes). `validate_cache=True`
    verifies every checksum while loading and compares each sample's embedded metadata
    with its table row on every read. Unknown keys are rejected.

    `io_backend`, `sampling` and `prefetch_bytes` are this package's extensions (not in
    dataset-rt 0.4.8): which I/O backend reads shards (every backend returns the same
    samples in the same order), whether shuffled reading draws with replacement (the
    reference) or in permutation passes, and the read-ahead byte budget of an iterator
    (0: automatic, a quarter of the CPU's last-level cache between 2 and 16 MiB), which
    bounds read-ahead together with `prefetch_size` so large records never keep
    `prefetch_size` of them in memory; samples and order never depend on it. At their
    defaults the fields are omitted from dumps, reprs and pickles (see the module
    docstring).
    """

    __module__ = _PUBLIC_MODULE

    model_config = ConfigDict(frozen=True, extra="forbid")
    _extension_defaults: ClassVar[dict[str, object]] = _READER_EXTENSION_DEFAULTS

    seed: int = Field(description="Seed of the deterministic sampling stream.")
    prefetch_size: int = Field(
        default=64,
        gt=0,
        description="Bound on samples read ahead of the consumer.",
    )
    shuffle: bool = Field(
        default=True,
        description="Whether future iterators draw weighted samples, not table order.",
    )
    validate_cache: bool = Field(
        default=False,
        description="Whether checksums and embedded metadata are verified on read.",
    )
    io_backend: IoBackend = Field(
        default="auto",
        description=(
            "Extension: shard read backend; 'auto' uses io_uring where the kernel "
            "allows it and threads otherwise, and on io_uring hands reads of 256 KiB or "
            "more whose bytes are in the page cache to the worker threads while no read "
            "waits on the ring. Omitted from dumps when 'auto'."
        ),
    )
    sampling: Sampling = Field(
        default="with_replacement",
        description=(
            "Extension: with shuffle=True, 'with_replacement' (the reference's weighted "
            "draws) or 'permutation' (passes that visit every active row exactly once in a "
            "seeded order; weights count only through duplicated rows). Ignored when "
            "shuffle=False. Omitted from dumps at its default."
        ),
    )
    prefetch_bytes: int = Field(
        default=0,
        ge=0,
        description=(
            "Extension: read-ahead byte budget per iterator, besides prefetch_size; 0 "
            "picks a quarter of the CPU's last-level cache (2 to 16 MiB). A record larger "
            "than the budget is read alone. Omitted from dumps at its default."
        ),
    )


class DatasetConfiguration(BaseModel):
    """Schema of `dataset.json` written by `dump_config` and read by `from_config`.

    Internal (not re-exported). Layout, validation and messages follow dataset-rt 0.4.8
    (reference section 2.8): strict types, unknown keys rejected, `version` must be 2,
    at least one `cache_paths` entry and each must be an existing directory (checked on
    construction and on load) or, our extension, an object store URL (`s3://...`, kept
    as a string and checked when the dataset opens), positive
    `num_workers`/`epoch_len`/`row_count`, and
    `metadata_file` fixed to `"metadata.arrow"`. The nested `reader_config` keeps
    `ReaderConfig`'s own (lax) rules, as in the reference. Write it with
    `model_dump_json(indent=2)` (no trailing newline) to produce the reference's bytes;
    extension fields of `reader_config` appear only when not at their defaults, and
    only such files are unreadable by the reference.
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    version: Literal[2] = DATASET_CONFIG_VERSION
    cache_paths: tuple[CachePath, ...] = Field(min_length=1)
    reader_config: ReaderConfig
    num_workers: PositiveInt
    epoch_len: PositiveInt
    row_count: PositiveInt
    metadata_file: Literal["metadata.arrow"] = DATASET_METADATA_FILE
