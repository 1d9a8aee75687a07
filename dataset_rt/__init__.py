"""dataset_rt: a dataset cache for ML training with a native core written in Zig.

Preprocess once into immutable on-disk caches, then read samples in a deterministic order
or a deterministic weighted shuffle, steered by a Polars metadata table. Storage-compatible
with dataset-rt 0.4.8. See ``docs/`` for guides and the storage format.
"""

from dataset_rt import _distribution, _native
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
from dataset_rt.sdk import get_include, get_library_dir

# Before anything is used: the reference release installed over the same directory
# would leave a mix of both packages' files (see _distribution).
_distribution.check_single_owner()


def native_info() -> dict[str, object]:
    """Facts about the loaded native library: version, C ABI, path, whether io_uring is
    usable in this process (the "auto" backend's choice), and the SHA-256 implementation."""
    major, minor = _native.abi_version()
    return {
        "version": _native.version(),
        "abi": f"{major}.{minor}",
        "library": _native.library_path(),
        "io_uring_available": _native.io_uring_available(),
        "sha256": _native.sha256_implementation(),
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
    "get_include",
    "get_library_dir",
    "native_info",
]
