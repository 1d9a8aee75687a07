"""The stable facade: every public name of dataset_rt, as in dataset-rt 0.4.8.

Public classes report ``__module__ == "dataset_rt.api"`` so that pickles and reprs name
this module, whichever internal module defines them.
"""

from dataset_rt.config import (
    DEFAULT_SHARD_COMPRESSION,
    DEFAULT_WRITER_CONFIG,
    DEFAULT_WRITER_PROFILER_CONFIG,
    CompressionAlgo,
    ReaderConfig,
    ShardCompression,
    WriterConfig,
    WriterProfilerConfig,
)
from dataset_rt.dataset import CachedDataset
from dataset_rt.records import (
    AbsentManifestTarget,
    BytesLike,
    CachedSample,
    CacheInput,
    CacheSource,
    CacheSourcesDatasetError,
    CacheSourcesDatasetResult,
    CacheSourcesDatasetSuccess,
    CacheWriteError,
    CacheWriteResult,
    CacheWriteSuccess,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateError,
    ManifestUpdateReport,
    Metadata,
    MetadataValue,
    Ok,
    Result,
    SizedTorchIterableDataset,
)
from dataset_rt.runtime import DatasetRuntime

for _cls in (CachedDataset, DatasetRuntime):
    _cls.__module__ = __name__
del _cls

__all__ = [
    "DEFAULT_SHARD_COMPRESSION",
    "DEFAULT_WRITER_CONFIG",
    "DEFAULT_WRITER_PROFILER_CONFIG",
    "AbsentManifestTarget",
    "BytesLike",
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
    "CompressionAlgo",
    "DatasetRuntime",
    "Err",
    "ManifestUpdateEntry",
    "ManifestUpdateError",
    "ManifestUpdateReport",
    "Metadata",
    "MetadataValue",
    "Ok",
    "ReaderConfig",
    "Result",
    "ShardCompression",
    "SizedTorchIterableDataset",
    "WriterConfig",
    "WriterProfilerConfig",
]
