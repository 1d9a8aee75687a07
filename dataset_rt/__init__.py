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

__all__ = [
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
    "ReaderConfig",
    "ShardCompression",
    "SizedTorchIterableDataset",
    "WriterConfig",
    "WriterProfilerConfig",
    "AbsentManifestTarget",
    "Err",
    "ManifestUpdateEntry",
    "ManifestUpdateError",
    "ManifestUpdateReport",
    "Ok",
    "Result",
]
