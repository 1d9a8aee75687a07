"""Source protocols, sample records and typed outcomes of cache operations.

Contract: names, field order, reprs, equality, hashing, pickling and `match` behaviour
equal dataset-rt 0.4.8's.

* The NamedTuples and Protocols report `__module__ == "dataset_rt.api"` (the stable
  facade), so their reprs and pickles name `dataset_rt.api.<Name>` as the reference's
  do. Pickling them needs `dataset_rt.api` to be importable.
* `Ok`, `Err`, the `ManifestUpdate*` records and `AbsentManifestTarget` are
  frozen dataclasses that report `__module__ == "dataset_rt.records"`, as in the
  reference. They compare by value and are hashable when their fields are.

Annotations are real objects (no `from __future__ import annotations`) so that
`typing.get_type_hints` works on every record; the only forward reference is
`CachedDataset`, which the `dataset_rt.api` facade re-exports. It stays a string and is
never imported here: records sit below `dataset_rt.dataset` in the module layers, and
`get_type_hints` resolves it in `dataset_rt.api`, the module these records report.
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import (
    Generic,
    Literal,
    NamedTuple,
    Protocol,
    TypeAlias,
    TypeVar,
)

T = TypeVar("T")
E = TypeVar("E")

# See the module docstring: pickles and reprs name the stable facade.
_PUBLIC_MODULE = "dataset_rt.api"

MetadataValue: TypeAlias = bool | int | float | str
"""One metadata value; a key keeps one type across all samples of a source."""

Metadata: TypeAlias = Mapping[str, MetadataValue]
"""A sample's metadata: column name to primitive value."""

BytesLike: TypeAlias = bytes | bytearray | memoryview
"""An already-serialized payload; it is stored and returned as bytes, uninterpreted."""


# ------------------------------------------------------------------------------------
# Expected-outcome values (module "dataset_rt.records", as in the reference).


@dataclass(frozen=True)
class Ok(Generic[T]):
    """A successful outcome; narrow a `Result` with `match` to reach `value`."""

    value: T


@dataclass(frozen=True)
class Err(Generic[E]):
    """An expected failure returned as a value instead of raised; carries `error`."""

    error: E


Result: TypeAlias = Ok[T] | Err[E]
"""`Ok[T] | Err[E]`. Only expected failures are values; interrupts and bugs raise."""

ManifestUpdateStatus: TypeAlias = Literal["updated", "unchanged", "durability_unknown"]
"""`updated`: rewritten as format 3; `unchanged`: already format 3, left
byte-identical; `durability_unknown`: the rename succeeded but the directory fsync
failed."""


@dataclass(frozen=True)
class ManifestUpdateEntry:
    """What `update_manifests` did to one cache's manifest.

    `path` is the resolved manifest file (a symlinked manifest reports its target);
    `cache_id` is the id now persisted in it.
    """

    path: Path
    cache_id: int
    status: ManifestUpdateStatus


@dataclass(frozen=True)
class ManifestUpdateReport:
    """A completed migration: one entry per cache, in the dataset's cache order."""

    entries: tuple[ManifestUpdateEntry, ...]


@dataclass(frozen=True)
class AbsentManifestTarget:
    """Stands in for a manifest path when a request was rejected as a whole."""

    reason: str


@dataclass(frozen=True)
class ManifestUpdateError:
    """A failed migration.

    `path` is the manifest that failed, or an `AbsentManifestTarget` when the request
    itself was invalid. `entries` lists the caches completed before the failure, so a
    caller can inspect them and retry.
    """

    path: Path | AbsentManifestTarget
    message: str
    entries: tuple[ManifestUpdateEntry, ...] = ()


# ------------------------------------------------------------------------------------
# Samples and write results (module "dataset_rt.api", as in the reference).


class CacheInput(NamedTuple):
    """One sample yielded by a `CacheSource`.

    `data` is the serialized payload (bytes-like). `metadata` maps str keys to
    bool/int/float/str values; it becomes the sample's row in the metadata table and is
    embedded in the shard record.
    """

    __module__ = _PUBLIC_MODULE  # type: ignore[misc]

    data: BytesLike
    metadata: Metadata


class CachedSample(NamedTuple):
    """One sample delivered by iterating a `CachedDataset` or by `get_item`.

    `cache_id` is the cache's stored id (format 3) or its position in the dataset's
    cache paths (format 2); `sample_id` is the sample's physical row in that cache.
    """

    __module__ = _PUBLIC_MODULE  # type: ignore[misc]

    data: bytes
    metadata: dict[str, MetadataValue]
    cache_id: int
    sample_id: int


class CacheWriteSuccess(NamedTuple):
    """A source whose cache was written or reused.

    `path` is `Path(base_dir) / source_name` as the caller gave `base_dir`
    (a relative base stays relative).
    """

    __module__ = _PUBLIC_MODULE  # type: ignore[misc]

    source_name: str
    path: Path


class CacheWriteError(NamedTuple):
    """A source that was not written; the other sources of the call still ran.

    `source_name` is `"source[i]"` when the name could not be read or is invalid.
    """

    __module__ = _PUBLIC_MODULE  # type: ignore[misc]

    source_name: str
    message: str


CacheWriteResult: TypeAlias = CacheWriteSuccess | CacheWriteError
"""Per-source outcome of a write, in source order."""


class CacheSourcesDatasetSuccess(NamedTuple):
    """`from_cache_sources` loaded at least one cache.

    `dataset` holds every cache that was written or reused; `results` has one entry
    per source, failures included.
    """

    __module__ = _PUBLIC_MODULE  # type: ignore[misc]

    dataset: "CachedDataset"  # noqa: F821 - resolved in dataset_rt.api (module docstring)
    results: list[CacheWriteResult]


class CacheSourcesDatasetError(NamedTuple):
    """`from_cache_sources` produced no cache, so no dataset was loaded.

    `message` is `"no cache sources were provided"` or
    `"no caches were written: "` followed by `"name: msg"` parts joined by `"; "`.
    """

    __module__ = _PUBLIC_MODULE  # type: ignore[misc]

    results: list[CacheWriteResult]
    message: str


CacheSourcesDatasetResult: TypeAlias = CacheSourcesDatasetSuccess | CacheSourcesDatasetError
"""Outcome of `DatasetRuntime.from_cache_sources`."""


# ------------------------------------------------------------------------------------
# Protocols (duck typed; deliberately not runtime-checkable, as in the reference).


class CacheSource(Protocol):
    """What the writer consumes: a `name` and an iterator of `CacheInput`.

    `name` is a plain path segment; the cache is written to `base_dir / name` and a
    complete cache already there is reused without iterating the source. `__iter__` is
    called at most once per write and is consumed synchronously (in a spawned child when
    `WriterConfig.num_processes > 0`). Any 2-tuple `(data, metadata)` is accepted as
    a sample.
    """

    __module__ = _PUBLIC_MODULE  # type: ignore[misc]

    name: str

    def __iter__(self) -> Iterator[CacheInput]:
        """Yield the source's samples in the order they are to be stored."""
        ...


class SizedTorchIterableDataset(Protocol):
    """The sized PyTorch iterable from `CachedDataset.to_torch_iterable_dataset()`."""

    __module__ = _PUBLIC_MODULE  # type: ignore[misc]

    def __iter__(self) -> Iterator[CachedSample]:
        """Yield samples in the dataset's iteration order."""
        ...

    def __len__(self) -> int:
        """Return the dataset's epoch length."""
        ...
