"""dataset_rt: a dataset cache for ML training with a native core written in Zig.

Preprocess once into immutable on-disk caches, then read samples in a deterministic order
or a deterministic weighted shuffle, steered by a Polars metadata table. Storage-compatible
with dataset-rt 0.4.8. See ``docs/`` for guides and the storage format.
"""

from dataset_rt.api import (
    AbsentManifestTarget,
    CachedDataset,
    CachedSample,
    CacheInput,
    CacheSource,
    CacheSourcesDatasetError,
    CacheSourcesDatasetResult,
    CacheSourcesDatasetSuccess,
    CacheWriteError,
    CacheWriteResult,
    CacheWriteSuccess,
    DatasetRuntime,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateError,
    ManifestUpdateReport,
    Ok,
    ReaderConfig,
    Result,
    ShardCompression,
    SizedTorchIterableDataset,
    WriterConfig,
    WriterProfilerConfig,
)


def native_info() -> dict[str, object]:
    """Facts about the loaded native library: version, C ABI, path, whether io_uring is
    usable in this process (the "auto" backend's choice), and the SHA-256 implementation."""
    from dataset_rt._native import ffi, lib, library_path

    abi = lib.drt_abi_version()
    return {
        "version": ffi.string(lib.drt_version()).decode(),
        "abi": f"{abi >> 16}.{abi & 0xFFFF}",
        "library": library_path(),
        "io_uring_available": bool(lib.drt_io_uring_available()),
        "sha256": ffi.string(lib.drt_sha256_implementation()).decode(),
    }


__all__ = [
    "AbsentManifestTarget",
    "CacheInput",
    "CacheSource",
    "CacheSourcesDatasetError",
    "CacheSourcesDatasetResult",
    "CacheSourcesDatasetSuccess",
    "CacheWriteError",
    "CacheWriteResult",
    "CacheWriteSuccess",
    "CachedDataset",
    "CachedSample",
    "DatasetRuntime",
    "Err",
    "ManifestUpdateEntry",
    "ManifestUpdateError",
    "ManifestUpdateReport",
    "Ok",
    "ReaderConfig",
    "Result",
    "ShardCompression",
    "SizedTorchIterableDataset",
    "WriterConfig",
    "WriterProfilerConfig",
    "native_info",
]
