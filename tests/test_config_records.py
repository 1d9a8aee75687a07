"""Configuration models and records behave exactly like dataset-rt 0.4.8's.

Every expected value here (reprs, error types, messages, coercions, JSON bytes, pickle
bytes) was observed by running the reference release (dataset-rt 0.4.8 with pydantic
2.14.4) and is hard-coded, so these tests do not need the reference installed.
Reference behaviour is described in shared/reference/dataset-rt-0.4.8.md sections 1.2,
1.3 and 2.8. The `io_backend` tests cover this project's extension of `ReaderConfig`.
"""

import dataclasses
import importlib
import inspect
import json
import math
import pickle
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import ValidationError

from dataset_rt.config import (
    DEFAULT_SHARD_COMPRESSION,
    DEFAULT_WRITER_CONFIG,
    DEFAULT_WRITER_PROFILER_CONFIG,
    CompressionAlgo,
    DatasetConfiguration,
    IoBackend,
    ReaderConfig,
    ShardCompression,
    WriterConfig,
    WriterProfilerConfig,
)
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

CONFIG_CLASSES = (ShardCompression, WriterProfilerConfig, WriterConfig, ReaderConfig)
NAMED_TUPLES = (
    CacheInput,
    CachedSample,
    CacheWriteSuccess,
    CacheWriteError,
    CacheSourcesDatasetSuccess,
    CacheSourcesDatasetError,
)
PROTOCOLS = (CacheSource, SizedTorchIterableDataset)
DATACLASSES = (
    Ok,
    Err,
    ManifestUpdateEntry,
    ManifestUpdateReport,
    AbsentManifestTarget,
    ManifestUpdateError,
)

TIMEOUT = "process_timeout_seconds"
MSG_GT0 = "Input should be greater than 0"
MSG_GE0 = "Input should be greater than or equal to 0"
MSG_FRACTION = "Input should be a valid integer, got a number with a fractional part"
MSG_FINITE = "Input should be a finite number"
MSG_INT = "Input should be a valid integer"
MSG_INT_PARSING = "Input should be a valid integer, unable to parse string as an integer"
MSG_BOOL = "Input should be a valid boolean"
MSG_BOOL_PARSING = "Input should be a valid boolean, unable to interpret input"
MSG_EXTRA = "Extra inputs are not permitted"
MSG_ALGO = "Input should be 'none' or 'lz4'"
MSG_BACKEND = "Input should be 'auto', 'io_uring' or 'threads'"
MSG_TOO_SHORT = "Tuple should have at least 1 item after validation, not 0"

DEFAULT_WRITER_REPR = (
    "WriterConfig(num_processes=0, process_timeout_seconds=3600.0, prefetch_size=64, "
    "max_shard_bytes=67108864, shard_compression=ShardCompression(algo='none', "
    "ratio=1.0), show_progress=True, validate_cache=False, "
    "profiler=WriterProfilerConfig(enabled=False, "
    "path=PosixPath('dataset_rt_profile.json')))"
)
DEFAULT_WRITER_JSON = (
    '{"num_processes":0,"process_timeout_seconds":3600.0,"prefetch_size":64,'
    '"max_shard_bytes":67108864,"shard_compression":{"algo":"none","ratio":1.0},'
    '"show_progress":true,"validate_cache":false,'
    '"profiler":{"enabled":false,"path":"dataset_rt_profile.json"}}'
)
READER_SEED3_JSON = '{"seed":3,"prefetch_size":64,"shuffle":true,"validate_cache":false}'

# pickle.dumps(<obj>, protocol=4) under dataset-rt 0.4.8.
REF_PICKLE_READER_SEED3 = (
    b"\x80\x04\x95\xc0\x00\x00\x00\x00\x00\x00\x00\x8c\x0edataset_rt.api\x94\x8c\x0c"
    b"ReaderConfig\x94\x93\x94)\x81\x94}\x94(\x8c\x08__dict__\x94}\x94(\x8c\x04seed"
    b"\x94K\x03\x8c\rprefetch_size\x94K@\x8c\x07shuffle\x94\x88\x8c\x0evalidate_cache"
    b"\x94\x89u\x8c\x12__pydantic_extra__\x94N\x8c\x17__pydantic_fields_set__\x94\x8f"
    b"\x94(h\x07\x90\x8c\x14__pydantic_private__\x94Nub."
)
REF_PICKLE_READER_SEED7_NO_SHUFFLE = (
    b"\x80\x04\x95\xc2\x00\x00\x00\x00\x00\x00\x00\x8c\x0edataset_rt.api\x94\x8c\x0c"
    b"ReaderConfig\x94\x93\x94)\x81\x94}\x94(\x8c\x08__dict__\x94}\x94(\x8c\x04seed"
    b"\x94K\x07\x8c\rprefetch_size\x94K@\x8c\x07shuffle\x94\x89\x8c\x0evalidate_cache"
    b"\x94\x89u\x8c\x12__pydantic_extra__\x94N\x8c\x17__pydantic_fields_set__\x94\x8f"
    b"\x94(h\th\x07\x90\x8c\x14__pydantic_private__\x94Nub."
)
REF_PICKLE_WRITER_DEFAULT = (
    b"\x80\x04\x95\xed\x01\x00\x00\x00\x00\x00\x00\x8c\x0edataset_rt.api\x94\x8c\x0c"
    b"WriterConfig\x94\x93\x94)\x81\x94}\x94(\x8c\x08__dict__\x94}\x94(\x8c\r"
    b"num_processes\x94K\x00\x8c\x17process_timeout_seconds\x94G@\xac \x00\x00\x00\x00"
    b"\x00\x8c\rprefetch_size\x94K@\x8c\x0fmax_shard_bytes\x94J\x00\x00\x00\x04\x8c\x11"
    b"shard_compression\x94h\x00\x8c\x10ShardCompression\x94\x93\x94)\x81\x94}\x94(h"
    b"\x05}\x94(\x8c\x04algo\x94\x8c\x04none\x94\x8c\x05ratio\x94G?\xf0\x00\x00\x00"
    b"\x00\x00\x00u\x8c\x12__pydantic_extra__\x94N\x8c\x17__pydantic_fields_set__\x94"
    b"\x8f\x94\x8c\x14__pydantic_private__\x94Nub\x8c\rshow_progress\x94\x88\x8c\x0e"
    b"validate_cache\x94\x89\x8c\x08profiler\x94h\x00\x8c\x14WriterProfilerConfig\x94"
    b"\x93\x94)\x81\x94}\x94(h\x05}\x94(\x8c\x07enabled\x94\x89\x8c\x04path\x94\x8c"
    b"\x07pathlib\x94\x8c\tPosixPath\x94\x93\x94\x8c\x17dataset_rt_profile.json\x94"
    b"\x85\x94R\x94uh\x14Nh\x15\x8f\x94h\x17Nubuh\x14Nh\x15\x8f\x94h\x17Nub."
)
REF_PICKLE_CACHE_WRITE_SUCCESS = (
    b"\x80\x04\x95P\x00\x00\x00\x00\x00\x00\x00\x8c\x0edataset_rt.api\x94\x8c\x11"
    b"CacheWriteSuccess\x94\x93\x94\x8c\x01a\x94\x8c\x07pathlib\x94\x8c\tPosixPath"
    b"\x94\x93\x94\x8c\x01b\x94\x85\x94R\x94\x86\x94\x81\x94."
)
REF_PICKLE_CACHED_SAMPLE = (
    b"\x80\x04\x959\x00\x00\x00\x00\x00\x00\x00\x8c\x0edataset_rt.api\x94\x8c\x0c"
    b"CachedSample\x94\x93\x94(C\x01x\x94}\x94\x8c\x01k\x94K\x01sK\x02K\x03t\x94\x81\x94."
)
REF_PICKLE_CACHE_WRITE_ERROR_P2 = (
    b"\x80\x02cdataset_rt.api\nCacheWriteError\nq\x00X\t\x00\x00\x00source[0]q\x01X"
    b"\x04\x00\x00\x00boomq\x02\x86q\x03\x81q\x04."
)
REF_PICKLE_MANIFEST_ENTRY = (
    b"\x80\x04\x95\x91\x00\x00\x00\x00\x00\x00\x00\x8c\x12dataset_rt.records\x94\x8c"
    b"\x13ManifestUpdateEntry\x94\x93\x94)\x81\x94}\x94(\x8c\x04path\x94\x8c\x07"
    b"pathlib\x94\x8c\tPosixPath\x94\x93\x94\x8c\x01/\x94\x8c\x01a\x94\x8c\r"
    b"manifest.json\x94\x87\x94R\x94\x8c\x08cache_id\x94K\x05\x8c\x06status\x94\x8c"
    b"\x07updated\x94ub."
)


def errors_of(exc_info: pytest.ExceptionInfo[ValidationError]) -> list[tuple[Any, ...]]:
    """(type, loc, msg) of each pydantic error, in pydantic's order."""
    return [(e["type"], e["loc"], e["msg"]) for e in exc_info.value.errors()]


@pytest.fixture(scope="module")
def facade() -> ModuleType:
    """The `dataset_rt.api` facade, which every pickle of a public class names."""
    return importlib.import_module("dataset_rt.api")


# --------------------------------------------------------------------------------------
# Module identity, field order, signatures


@pytest.mark.parametrize("cls", CONFIG_CLASSES + NAMED_TUPLES + PROTOCOLS)
def test_public_classes_report_the_facade_module(cls: type) -> None:
    assert cls.__module__ == "dataset_rt.api"
    assert "." not in cls.__qualname__


@pytest.mark.parametrize("cls", DATACLASSES)
def test_outcome_dataclasses_report_the_records_module(cls: type) -> None:
    assert cls.__module__ == "dataset_rt.records"
    assert dataclasses.is_dataclass(cls)
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_facade_reexports_the_same_objects(facade: ModuleType) -> None:
    for cls in CONFIG_CLASSES + NAMED_TUPLES + PROTOCOLS + DATACLASSES:
        assert getattr(facade, cls.__name__) is cls
    assert facade.DEFAULT_WRITER_CONFIG is DEFAULT_WRITER_CONFIG
    assert facade.DEFAULT_SHARD_COMPRESSION is DEFAULT_SHARD_COMPRESSION
    assert facade.DEFAULT_WRITER_PROFILER_CONFIG is DEFAULT_WRITER_PROFILER_CONFIG


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (ShardCompression, ["algo", "ratio"]),
        (WriterProfilerConfig, ["enabled", "path"]),
        (
            WriterConfig,
            [
                "num_processes",
                "process_timeout_seconds",
                "prefetch_size",
                "max_shard_bytes",
                "shard_compression",
                "show_progress",
                "validate_cache",
                "profiler",
                "on_stale",  # our extension, after the reference's fields
            ],
        ),
        # io_backend is our extension and comes after the reference's fields.
        (
            ReaderConfig,
            [
                "seed",
                "prefetch_size",
                "shuffle",
                "validate_cache",
                "io_backend",
                "sampling",
                "prefetch_bytes",
            ],
        ),
    ],
)
def test_config_field_order(cls: Any, fields: list[str]) -> None:
    assert list(cls.model_fields) == fields


@pytest.mark.parametrize(
    ("cls", "signature"),
    [
        (
            ShardCompression,
            "(*, algo: Literal['none', 'lz4'] = 'none', "
            "ratio: typing.Annotated[float, Gt(gt=0)] = 1.0) -> None",
        ),
        (
            WriterProfilerConfig,
            "(*, enabled: bool = False, "
            "path: pathlib.Path = PosixPath('dataset_rt_profile.json')) -> None",
        ),
        (
            WriterConfig,
            "(*, num_processes: typing.Annotated[int, Ge(ge=0)] = 0, "
            "process_timeout_seconds: typing.Annotated[float, Gt(gt=0), "
            "AllowInfNan(allow_inf_nan=False)] = 3600.0, "
            "prefetch_size: typing.Annotated[int, Gt(gt=0)] = 64, "
            "max_shard_bytes: typing.Annotated[int, Gt(gt=0)] = 67108864, "
            "shard_compression: dataset_rt.api.ShardCompression = "
            "ShardCompression(algo='none', ratio=1.0), show_progress: bool = True, "
            "validate_cache: bool = False, "
            "profiler: dataset_rt.api.WriterProfilerConfig = "
            "WriterProfilerConfig(enabled=False, "
            "path=PosixPath('dataset_rt_profile.json')), "
            "on_stale: Literal['error', 'rebuild'] = 'error') -> None",
        ),
        (
            ReaderConfig,
            # The reference's signature plus the io_backend, sampling and prefetch_bytes
            # extensions.
            "(*, seed: int, prefetch_size: typing.Annotated[int, Gt(gt=0)] = 64, "
            "shuffle: bool = True, validate_cache: bool = False, "
            "io_backend: Literal['auto', 'io_uring', 'threads'] = 'auto', "
            "sampling: Literal['with_replacement', 'permutation'] = 'with_replacement', "
            "prefetch_bytes: typing.Annotated[int, Ge(ge=0)] = 0) -> None",
        ),
    ],
)
def test_config_signatures(cls: type, signature: str) -> None:
    assert str(inspect.signature(cls)) == signature


def test_type_aliases() -> None:
    assert CompressionAlgo == typing.Literal["none", "lz4"]
    assert IoBackend == typing.Literal["auto", "io_uring", "threads"]
    assert typing.get_args(BytesLike) == (bytes, bytearray, memoryview)
    assert typing.get_args(MetadataValue) == (bool, int, float, str)
    assert typing.get_origin(Metadata) is Mapping
    assert typing.get_args(Metadata) == (str, MetadataValue)
    assert CacheWriteResult == CacheWriteSuccess | CacheWriteError
    assert CacheSourcesDatasetResult == (CacheSourcesDatasetSuccess | CacheSourcesDatasetError)
    ok_alias, err_alias = typing.get_args(Result)
    assert typing.get_origin(ok_alias) is Ok
    assert typing.get_origin(err_alias) is Err
    assert typing.get_args(Result[int, str]) == (Ok[int], Err[str])
    assert repr(Result) == ("typing.Union[dataset_rt.records.Ok[~T], dataset_rt.records.Err[~E]]")
    assert repr(CacheWriteResult) == (
        "dataset_rt.api.CacheWriteSuccess | dataset_rt.api.CacheWriteError"
    )


# --------------------------------------------------------------------------------------
# Defaults, reprs and JSON


def test_shard_compression_defaults() -> None:
    value = ShardCompression()
    assert (value.algo, value.ratio) == ("none", 1.0)
    assert repr(value) == "ShardCompression(algo='none', ratio=1.0)"
    assert value == DEFAULT_SHARD_COMPRESSION
    assert value.model_dump_json() == '{"algo":"none","ratio":1.0}'


def test_writer_profiler_defaults() -> None:
    value = WriterProfilerConfig()
    assert value.enabled is False
    assert value.path == Path("dataset_rt_profile.json")
    assert type(value.path) is type(Path("x"))
    assert repr(value) == (
        "WriterProfilerConfig(enabled=False, path=PosixPath('dataset_rt_profile.json'))"
    )
    assert value == DEFAULT_WRITER_PROFILER_CONFIG


def test_writer_config_defaults() -> None:
    value = WriterConfig()
    assert value.num_processes == 0
    assert value.process_timeout_seconds == 3600.0
    assert value.prefetch_size == 64
    assert value.max_shard_bytes == 67108864 == 64 * 1024 * 1024
    assert value.show_progress is True
    assert value.validate_cache is False
    # Frozen (hashable) defaults are shared, not copied, as in the reference.
    assert value.shard_compression is DEFAULT_SHARD_COMPRESSION
    assert value.profiler is DEFAULT_WRITER_PROFILER_CONFIG
    assert value == DEFAULT_WRITER_CONFIG
    assert value is not DEFAULT_WRITER_CONFIG
    assert repr(value) == DEFAULT_WRITER_REPR
    assert str(value) == (
        "num_processes=0 process_timeout_seconds=3600.0 prefetch_size=64 "
        "max_shard_bytes=67108864 shard_compression=ShardCompression(algo='none', "
        "ratio=1.0) show_progress=True validate_cache=False "
        "profiler=WriterProfilerConfig(enabled=False, "
        "path=PosixPath('dataset_rt_profile.json'))"
    )
    assert value.model_dump_json() == DEFAULT_WRITER_JSON
    assert value.model_dump() == {
        "num_processes": 0,
        "process_timeout_seconds": 3600.0,
        "prefetch_size": 64,
        "max_shard_bytes": 67108864,
        "shard_compression": {"algo": "none", "ratio": 1.0},
        "show_progress": True,
        "validate_cache": False,
        "profiler": {"enabled": False, "path": Path("dataset_rt_profile.json")},
    }


def test_writer_config_indented_json() -> None:
    assert WriterConfig().model_dump_json(indent=2) == json.dumps(
        json.loads(DEFAULT_WRITER_JSON), indent=2
    )


def test_reader_config_defaults_repr_and_json() -> None:
    value = ReaderConfig(seed=3)
    assert (value.seed, value.prefetch_size, value.shuffle, value.validate_cache) == (
        3,
        64,
        True,
        False,
    )
    assert value.io_backend == "auto"
    assert repr(value) == (
        "ReaderConfig(seed=3, prefetch_size=64, shuffle=True, validate_cache=False)"
    )
    assert str(value) == "seed=3 prefetch_size=64 shuffle=True validate_cache=False"
    assert value.model_dump_json() == READER_SEED3_JSON
    assert value.model_dump() == {
        "seed": 3,
        "prefetch_size": 64,
        "shuffle": True,
        "validate_cache": False,
    }


def test_big_ints_pass_pydantic_and_serialize() -> None:
    # Range checks happen natively when a dataset or write starts, not in pydantic.
    value = ReaderConfig(seed=2**64 - 1, prefetch_size=2**64)
    assert value.model_dump_json() == (
        '{"seed":18446744073709551615,"prefetch_size":18446744073709551616,'
        '"shuffle":true,"validate_cache":false}'
    )
    assert ReaderConfig(seed=-1).seed == -1
    assert WriterConfig(prefetch_size=2**64).prefetch_size == 2**64
    assert WriterConfig(max_shard_bytes=1).max_shard_bytes == 1


# --------------------------------------------------------------------------------------
# Validation: accepted coercions and rejected inputs with pydantic error types


@pytest.mark.parametrize(
    ("kwargs", "algo", "ratio"),
    [
        ({"algo": "lz4"}, "lz4", 1.0),
        ({"ratio": math.inf}, "none", math.inf),
        ({"ratio": "inf"}, "none", math.inf),
        ({"ratio": "2"}, "none", 2.0),
        ({"ratio": 2}, "none", 2.0),
        ({"ratio": True}, "none", 1.0),
        ({"algo": "none", "ratio": 2.0}, "none", 2.0),
        ({"algo": "lz4", "ratio": 0.5}, "lz4", 0.5),
    ],
)
def test_shard_compression_accepts(kwargs: dict[str, Any], algo: str, ratio: float) -> None:
    value = ShardCompression(**kwargs)
    assert value.algo == algo
    assert value.ratio == ratio
    assert type(value.ratio) is float


@pytest.mark.parametrize(
    ("kwargs", "error_type", "msg"),
    [
        ({"ratio": 0}, "greater_than", MSG_GT0),
        ({"ratio": -1}, "greater_than", MSG_GT0),
        ({"ratio": math.nan}, "greater_than", MSG_GT0),
        ({"ratio": None}, "float_type", "Input should be a valid number"),
        (
            {"ratio": "x"},
            "float_parsing",
            "Input should be a valid number, unable to parse string as a number",
        ),
        ({"algo": "zstd"}, "literal_error", MSG_ALGO),
        ({"algo": "LZ4"}, "literal_error", MSG_ALGO),
        ({"algo": None}, "literal_error", MSG_ALGO),
    ],
)
def test_shard_compression_rejects(kwargs: dict[str, Any], error_type: str, msg: str) -> None:
    with pytest.raises(ValidationError) as exc_info:
        ShardCompression(**kwargs)
    assert errors_of(exc_info) == [(error_type, tuple(kwargs), msg)]


def test_shard_compression_error_context() -> None:
    with pytest.raises(ValidationError) as exc_info:
        ShardCompression(ratio=0)
    assert exc_info.value.errors()[0]["ctx"] == {"gt": 0.0}
    with pytest.raises(ValidationError) as exc_info:
        ShardCompression(algo="zstd")
    assert exc_info.value.errors()[0]["ctx"] == {"expected": "'none' or 'lz4'"}


def test_lenient_configs_ignore_unknown_keys() -> None:
    compression = ShardCompression(algo="lz4", level=3)  # type: ignore[call-arg]
    assert compression == ShardCompression(algo="lz4")
    assert compression.model_extra is None
    assert "level" not in compression.__dict__
    profiler = WriterProfilerConfig(foo=1)  # type: ignore[call-arg]
    assert profiler == WriterProfilerConfig()
    assert profiler.model_extra is None


def test_writer_profiler_coercions_and_errors() -> None:
    assert WriterProfilerConfig(enabled="yes").enabled is True  # type: ignore[arg-type]
    assert WriterProfilerConfig(path="x.json").path == Path("x.json")  # type: ignore[arg-type]
    for bad in (None, 3, b"x"):
        with pytest.raises(ValidationError) as exc_info:
            WriterProfilerConfig(path=bad)  # type: ignore[arg-type]
        assert errors_of(exc_info) == [
            (
                "path_type",
                ("path",),
                "Input is not a valid path for <class 'pathlib.Path'>",
            )
        ]


@pytest.mark.parametrize(
    ("kwargs", "field", "expected"),
    [
        ({"num_processes": "2"}, "num_processes", 2),
        ({"num_processes": 0}, "num_processes", 0),
        ({"process_timeout_seconds": "10"}, "process_timeout_seconds", 10.0),
        ({"process_timeout_seconds": 5}, "process_timeout_seconds", 5.0),
        ({"max_shard_bytes": 1}, "max_shard_bytes", 1),
        (
            {"shard_compression": {"algo": "lz4", "ratio": 2}},
            "shard_compression",
            ShardCompression(algo="lz4", ratio=2.0),
        ),
        (
            {"shard_compression": {"algo": "lz4", "extra": 2}},
            "shard_compression",
            ShardCompression(algo="lz4"),
        ),
        ({"show_progress": "no"}, "show_progress", False),
        ({"validate_cache": "yes"}, "validate_cache", True),
        (
            {"profiler": {"enabled": True, "path": "p.json"}},
            "profiler",
            WriterProfilerConfig(enabled=True, path=Path("p.json")),
        ),
    ],
)
def test_writer_config_accepts(kwargs: dict[str, Any], field: str, expected: Any) -> None:
    value = getattr(WriterConfig(**kwargs), field)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("kwargs", "error_type", "loc", "msg"),
    [
        ({"num_processes": -1}, "greater_than_equal", ("num_processes",), MSG_GE0),
        ({"num_processes": 1.5}, "int_from_float", ("num_processes",), MSG_FRACTION),
        ({"process_timeout_seconds": math.inf}, "finite_number", (TIMEOUT,), MSG_FINITE),
        ({"process_timeout_seconds": math.nan}, "finite_number", (TIMEOUT,), MSG_FINITE),
        ({"process_timeout_seconds": "inf"}, "finite_number", (TIMEOUT,), MSG_FINITE),
        ({"process_timeout_seconds": 0}, "greater_than", (TIMEOUT,), MSG_GT0),
        ({"process_timeout_seconds": -1}, "greater_than", (TIMEOUT,), MSG_GT0),
        ({"prefetch_size": 0}, "greater_than", ("prefetch_size",), MSG_GT0),
        ({"max_shard_bytes": 0}, "greater_than", ("max_shard_bytes",), MSG_GT0),
        ({"max_shard_bytes": -5}, "greater_than", ("max_shard_bytes",), MSG_GT0),
        (
            {"shard_compression": None},
            "model_type",
            ("shard_compression",),
            "Input should be a valid dictionary or instance of ShardCompression",
        ),
        (
            {"shard_compression": "lz4"},
            "model_type",
            ("shard_compression",),
            "Input should be a valid dictionary or instance of ShardCompression",
        ),
        (
            {"shard_compression": {"algo": "zstd"}},
            "literal_error",
            ("shard_compression", "algo"),
            MSG_ALGO,
        ),
        (
            {"profiler": None},
            "model_type",
            ("profiler",),
            "Input should be a valid dictionary or instance of WriterProfilerConfig",
        ),
        ({"foo": 1}, "extra_forbidden", ("foo",), MSG_EXTRA),
    ],
)
def test_writer_config_rejects(
    kwargs: dict[str, Any], error_type: str, loc: tuple[str, ...], msg: str
) -> None:
    with pytest.raises(ValidationError) as exc_info:
        WriterConfig(**kwargs)
    assert errors_of(exc_info) == [(error_type, loc, msg)]


def test_writer_config_reports_every_error_in_field_order() -> None:
    with pytest.raises(ValidationError) as exc_info:
        WriterConfig(num_processes=-1, prefetch_size=0, foo=1)  # type: ignore[call-arg]
    assert errors_of(exc_info) == [
        ("greater_than_equal", ("num_processes",), MSG_GE0),
        ("greater_than", ("prefetch_size",), MSG_GT0),
        ("extra_forbidden", ("foo",), MSG_EXTRA),
    ]
    assert str(exc_info.value).startswith("3 validation errors for WriterConfig\n")


def test_writer_config_error_contexts() -> None:
    with pytest.raises(ValidationError) as exc_info:
        WriterConfig(num_processes=-1, process_timeout_seconds=0, prefetch_size=0)
    assert [e["ctx"] for e in exc_info.value.errors()] == [
        {"ge": 0},
        {"gt": 0.0},
        {"gt": 0},
    ]


@pytest.mark.parametrize(
    ("seed", "expected"),
    [
        ("3", 3),
        (" 3 ", 3),
        ("1.0", 1),
        (b"3", 3),
        (True, 1),
        (1.0, 1),
        (-1, -1),
        (2**64, 2**64),
    ],
)
def test_reader_seed_lax_coercions(seed: Any, expected: int) -> None:
    value = ReaderConfig(seed=seed)
    assert value.seed == expected
    assert type(value.seed) is int


@pytest.mark.parametrize(
    ("seed", "error_type", "msg"),
    [
        (1.5, "int_from_float", MSG_FRACTION),
        (3.0000001, "int_from_float", MSG_FRACTION),
        (None, "int_type", MSG_INT),
        ("x", "int_parsing", MSG_INT_PARSING),
        (math.inf, "finite_number", MSG_FINITE),
    ],
)
def test_reader_seed_rejects(seed: Any, error_type: str, msg: str) -> None:
    with pytest.raises(ValidationError) as exc_info:
        ReaderConfig(seed=seed)
    assert errors_of(exc_info) == [(error_type, ("seed",), msg)]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("yes", True),
        ("on", True),
        ("true", True),
        ("t", True),
        ("y", True),
        (b"yes", True),
        (1, True),
        (1.0, True),
        ("no", False),
        ("off", False),
        ("n", False),
        ("f", False),
        (0, False),
        (0.0, False),
    ],
)
def test_reader_shuffle_lax_coercions(raw: Any, expected: bool) -> None:
    assert ReaderConfig(seed=1, shuffle=raw).shuffle is expected
    assert ReaderConfig(seed=1, validate_cache=raw).validate_cache is expected


@pytest.mark.parametrize(
    ("raw", "error_type", "msg"),
    [
        (2, "bool_parsing", MSG_BOOL_PARSING),
        ("maybe", "bool_parsing", MSG_BOOL_PARSING),
        (1.5, "bool_type", MSG_BOOL),
        (None, "bool_type", MSG_BOOL),
    ],
)
@pytest.mark.parametrize("field", ["shuffle", "validate_cache"])
def test_reader_bool_fields_reject(raw: Any, error_type: str, msg: str, field: str) -> None:
    with pytest.raises(ValidationError) as exc_info:
        ReaderConfig(seed=1, **{field: raw})
    assert errors_of(exc_info) == [(error_type, (field,), msg)]


@pytest.mark.parametrize(("raw", "expected"), [(1, 1), ("5", 5), (5.0, 5), (True, 1)])
def test_reader_prefetch_accepts(raw: Any, expected: int) -> None:
    assert ReaderConfig(seed=1, prefetch_size=raw).prefetch_size == expected


@pytest.mark.parametrize(
    ("raw", "error_type", "msg"),
    [
        (0, "greater_than", MSG_GT0),
        (-1, "greater_than", MSG_GT0),
        (5.5, "int_from_float", MSG_FRACTION),
        (None, "int_type", MSG_INT),
    ],
)
def test_reader_prefetch_rejects(raw: Any, error_type: str, msg: str) -> None:
    with pytest.raises(ValidationError) as exc_info:
        ReaderConfig(seed=1, prefetch_size=raw)
    assert errors_of(exc_info) == [(error_type, ("prefetch_size",), msg)]


def test_reader_config_missing_seed_message() -> None:
    with pytest.raises(ValidationError) as exc_info:
        ReaderConfig()  # type: ignore[call-arg]
    assert errors_of(exc_info) == [("missing", ("seed",), "Field required")]
    assert str(exc_info.value).startswith(
        "1 validation error for ReaderConfig\n"
        "seed\n"
        "  Field required [type=missing, input_value={}, input_type=dict]\n"
    )


def test_reader_config_extra_key_message() -> None:
    with pytest.raises(ValidationError) as exc_info:
        ReaderConfig(seed=1, foo=2)  # type: ignore[call-arg]
    assert str(exc_info.value).startswith(
        "1 validation error for ReaderConfig\n"
        "foo\n"
        "  Extra inputs are not permitted [type=extra_forbidden, input_value=2, "
        "input_type=int]\n"
    )


def test_configs_take_keywords_only() -> None:
    with pytest.raises(TypeError, match="takes 1 positional argument but 2 were given"):
        ReaderConfig(1)  # type: ignore[misc]


def test_reader_config_json_validation_is_lax_too() -> None:
    expected = ReaderConfig(seed=3)
    assert ReaderConfig.model_validate_json('{"seed":"3"}') == expected
    assert ReaderConfig.model_validate_json('{"seed":3.0}') == expected
    assert ReaderConfig.model_validate_json('{"seed":3,"shuffle":"yes"}') == expected
    assert ReaderConfig.model_validate_json(READER_SEED3_JSON) == expected


# --------------------------------------------------------------------------------------
# Frozen, equality, hashing


@pytest.mark.parametrize(
    ("value", "field", "new"),
    [
        (WriterConfig(), "prefetch_size", 3),
        (ReaderConfig(seed=1), "seed", 2),
        (ReaderConfig(seed=1), "io_backend", "threads"),
        (ShardCompression(), "algo", "lz4"),
        (WriterProfilerConfig(), "enabled", True),
    ],
)
def test_configs_are_frozen(value: Any, field: str, new: Any) -> None:
    before = getattr(value, field)
    with pytest.raises(ValidationError) as exc_info:
        setattr(value, field, new)
    assert errors_of(exc_info) == [("frozen_instance", (field,), "Instance is frozen")]
    assert "Instance is frozen [type=frozen_instance" in str(exc_info.value)
    with pytest.raises(ValidationError) as exc_info:
        delattr(value, field)
    assert errors_of(exc_info) == [("frozen_instance", (field,), "Instance is frozen")]
    assert getattr(value, field) == before


def test_configs_compare_and_hash_by_value() -> None:
    assert ReaderConfig(seed=1) == ReaderConfig(seed=1.0)  # type: ignore[arg-type]
    assert hash(ReaderConfig(seed=1)) == hash(ReaderConfig(seed=True))  # type: ignore[arg-type]
    assert ReaderConfig(seed=1) != ReaderConfig(seed=2)
    assert ReaderConfig(seed=1) != {"seed": 1}
    assert hash(WriterConfig()) == hash(DEFAULT_WRITER_CONFIG)
    assert WriterConfig(shard_compression={"algo": "lz4"}) == WriterConfig(  # type: ignore[arg-type]
        shard_compression=ShardCompression(algo="lz4")
    )
    assert ShardCompression(ratio=2) == ShardCompression(ratio=2.0)
    assert len({WriterConfig(), DEFAULT_WRITER_CONFIG, WriterConfig(num_processes=1)}) == 2
    assert hash(WriterProfilerConfig()) == hash(DEFAULT_WRITER_PROFILER_CONFIG)


# --------------------------------------------------------------------------------------
# Pickling (needs the dataset_rt.api facade: pickles name dataset_rt.api.<Name>)


@pytest.mark.parametrize(
    "value",
    [
        ShardCompression(algo="lz4", ratio=2.0),
        WriterProfilerConfig(enabled=True, path=Path("p.json")),
        WriterConfig(num_processes=2, shard_compression=ShardCompression(algo="lz4")),
        DEFAULT_WRITER_CONFIG,
        ReaderConfig(seed=3),
        ReaderConfig(seed=7, shuffle=False, io_backend="threads"),
        ReaderConfig(seed=7, io_backend="io_uring"),
    ],
)
@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_configs_pickle_round_trip(facade: ModuleType, value: Any, protocol: int) -> None:
    data = pickle.dumps(value, protocol=protocol)
    assert b"dataset_rt.api" in data
    restored = pickle.loads(data)
    assert restored == value
    assert hash(restored) == hash(value)
    assert repr(restored) == repr(value)
    assert type(restored) is type(value)


def test_reference_config_pickles_load(facade: ModuleType) -> None:
    restored = pickle.loads(REF_PICKLE_READER_SEED3)
    assert restored == ReaderConfig(seed=3)
    # Reference pickles have no io_backend: it is filled with its default.
    assert restored.io_backend == "auto"
    assert hash(restored) == hash(ReaderConfig(seed=3))
    assert restored.model_dump_json() == READER_SEED3_JSON
    assert pickle.loads(REF_PICKLE_READER_SEED7_NO_SHUFFLE) == ReaderConfig(seed=7, shuffle=False)
    assert pickle.loads(REF_PICKLE_WRITER_DEFAULT) == DEFAULT_WRITER_CONFIG


def test_default_extension_fields_stay_out_of_pickles() -> None:
    # So that dataset-rt 0.4.8 unpickles our ReaderConfig to an equal object.
    state = ReaderConfig(seed=3, io_backend="auto").__getstate__()
    assert list(state["__dict__"]) == [
        "seed",
        "prefetch_size",
        "shuffle",
        "validate_cache",
    ]
    state = ReaderConfig(seed=3, io_backend="threads").__getstate__()
    assert state["__dict__"]["io_backend"] == "threads"


# --------------------------------------------------------------------------------------
# io_backend extension


@pytest.mark.parametrize("backend", ["auto", "io_uring", "threads"])
def test_io_backend_accepts_known_values(backend: str) -> None:
    assert ReaderConfig(seed=1, io_backend=backend).io_backend == backend  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["uring", "IO_URING", "Threads", "", None, 1])
def test_io_backend_rejects_unknown_values(backend: Any) -> None:
    with pytest.raises(ValidationError) as exc_info:
        ReaderConfig(seed=1, io_backend=backend)
    assert errors_of(exc_info) == [("literal_error", ("io_backend",), MSG_BACKEND)]


def test_io_backend_default_is_invisible_in_dumps_and_reprs() -> None:
    explicit = ReaderConfig(seed=3, io_backend="auto")
    assert explicit == ReaderConfig(seed=3)
    assert explicit.model_dump_json() == READER_SEED3_JSON
    assert "io_backend" not in explicit.model_dump()
    assert "io_backend" not in explicit.model_dump(mode="json")
    assert "io_backend" not in repr(explicit)
    assert "io_backend" not in str(explicit)


def test_io_backend_non_default_is_dumped_last() -> None:
    value = ReaderConfig(seed=3, io_backend="threads")
    assert value.model_dump_json() == (
        '{"seed":3,"prefetch_size":64,"shuffle":true,"validate_cache":false,"io_backend":"threads"}'
    )
    assert list(value.model_dump()) == [
        "seed",
        "prefetch_size",
        "shuffle",
        "validate_cache",
        "io_backend",
    ]
    assert repr(value) == (
        "ReaderConfig(seed=3, prefetch_size=64, shuffle=True, validate_cache=False, "
        "io_backend='threads')"
    )
    assert ReaderConfig.model_validate_json(value.model_dump_json()) == value
    assert ReaderConfig(**value.model_dump()) == value


def test_io_backend_respects_dump_filters() -> None:
    value = ReaderConfig(seed=3, io_backend="io_uring")
    assert value.model_dump(exclude={"io_backend"}) == ReaderConfig(seed=3).model_dump()
    assert value.model_dump(include={"seed"}) == {"seed": 3}
    assert value.model_dump(exclude_defaults=True) == {
        "seed": 3,
        "io_backend": "io_uring",
    }
    assert ReaderConfig(seed=3).model_dump(exclude_defaults=True) == {"seed": 3}


def test_io_backend_takes_part_in_equality_and_hashing() -> None:
    base = ReaderConfig(seed=3)
    threads = ReaderConfig(seed=3, io_backend="threads")
    uring = ReaderConfig(seed=3, io_backend="io_uring")
    assert base != threads != uring != base
    assert len({base, threads, uring, ReaderConfig(seed=3, io_backend="threads")}) == 3


def test_io_backend_keeps_the_json_schema_of_the_fields() -> None:
    # The serializer that hides defaults must not turn the schema into a bare object.
    for mode in ("validation", "serialization"):
        schema = ReaderConfig.model_json_schema(mode=mode)  # type: ignore[arg-type]
        assert list(schema["properties"]) == list(ReaderConfig.model_fields)
        assert schema["properties"]["io_backend"]["enum"] == [
            "auto",
            "io_uring",
            "threads",
        ]
        assert schema["required"] == ["seed"]
        assert schema["additionalProperties"] is False


# --------------------------------------------------------------------------------------
# dataset.json v2 model (reference section 2.8)

DATASET_JSON_TEMPLATE = (
    "{\n"
    '  "version": 2,\n'
    '  "cache_paths": [\n'
    '    "%s"\n'
    "  ],\n"
    '  "reader_config": {\n'
    '    "seed": 42,\n'
    '    "prefetch_size": 7,\n'
    '    "shuffle": true,\n'
    '    "validate_cache": false\n'
    "  },\n"
    '  "num_workers": 3,\n'
    '  "epoch_len": 4,\n'
    '  "row_count": 6,\n'
    '  "metadata_file": "metadata.arrow"\n'
    "}"
)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    path = tmp_path / "cache" / "src_a"
    path.mkdir(parents=True)
    return path


def dataset_json(cache_dir: Path) -> dict[str, Any]:
    return json.loads(DATASET_JSON_TEMPLATE % cache_dir)


def test_dataset_configuration_writes_the_reference_layout(cache_dir: Path) -> None:
    config = DatasetConfiguration(
        cache_paths=(cache_dir,),
        reader_config=ReaderConfig(seed=42, prefetch_size=7),
        num_workers=3,
        epoch_len=4,
        row_count=6,
    )
    assert list(DatasetConfiguration.model_fields) == [
        "version",
        "cache_paths",
        "reader_config",
        "num_workers",
        "epoch_len",
        "row_count",
        "metadata_file",
    ]
    text = config.model_dump_json(indent=2)
    assert text == DATASET_JSON_TEMPLATE % cache_dir
    assert DatasetConfiguration.model_validate_json(text) == config
    assert repr(config).startswith("DatasetConfiguration(version=2, cache_paths=(")
    assert hash(config) == hash(DatasetConfiguration.model_validate_json(text))


def test_dataset_configuration_carries_non_default_extensions(cache_dir: Path) -> None:
    config = DatasetConfiguration(
        cache_paths=(cache_dir,),
        reader_config=ReaderConfig(seed=42, prefetch_size=7, io_backend="threads"),
        num_workers=3,
        epoch_len=4,
        row_count=6,
    )
    text = config.model_dump_json(indent=2)
    assert '    "validate_cache": false,\n    "io_backend": "threads"\n  },' in text
    assert DatasetConfiguration.model_validate_json(text) == config


@pytest.mark.parametrize(
    ("change", "seed"),
    [
        ({"version": 2.0}, 42),
        ({"reader_config": {"seed": "3", "shuffle": "yes"}}, 3),
        ({"reader_config": {"seed": 3.0}}, 3),
        # Our extension at its default; dataset-rt 0.4.8 rejects any io_backend key.
        ({"reader_config": {"seed": 5, "io_backend": "auto"}}, 5),
    ],
)
def test_dataset_configuration_accepts(cache_dir: Path, change: dict[str, Any], seed: int) -> None:
    data = dataset_json(cache_dir)
    data.update(change)
    config = DatasetConfiguration.model_validate_json(json.dumps(data))
    assert config.version == 2
    assert config.reader_config.seed == seed


def test_dataset_configuration_relative_cache_path(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Accepted relative to the working directory and kept as given.
    monkeypatch.chdir(cache_dir.parent.parent)
    data = dataset_json(cache_dir)
    data["cache_paths"] = ["cache/src_a"]
    config = DatasetConfiguration.model_validate_json(json.dumps(data))
    assert config.cache_paths == (Path("cache/src_a"),)


def test_dataset_configuration_optional_keys_default(cache_dir: Path) -> None:
    data = dataset_json(cache_dir)
    del data["version"], data["metadata_file"]
    config = DatasetConfiguration.model_validate_json(json.dumps(data))
    assert (config.version, config.metadata_file) == (2, "metadata.arrow")


@pytest.mark.parametrize(
    ("change", "error_type", "loc", "msg"),
    [
        ({"version": "2"}, "literal_error", ("version",), "Input should be 2"),
        ({"version": 3}, "literal_error", ("version",), "Input should be 2"),
        (
            {"metadata_file": "x.arrow"},
            "literal_error",
            ("metadata_file",),
            "Input should be 'metadata.arrow'",
        ),
        ({"cache_paths": []}, "too_short", ("cache_paths",), MSG_TOO_SHORT),
        ({"num_workers": 0}, "greater_than", ("num_workers",), MSG_GT0),
        # Strict: no lax int coercion at the top level (the nested config stays lax).
        ({"num_workers": 1.0}, "int_type", ("num_workers",), MSG_INT),
        ({"num_workers": "1"}, "int_type", ("num_workers",), MSG_INT),
        ({"num_workers": True}, "int_type", ("num_workers",), MSG_INT),
        ({"epoch_len": 0}, "greater_than", ("epoch_len",), MSG_GT0),
        ({"row_count": 0}, "greater_than", ("row_count",), MSG_GT0),
        ({"foo": 1}, "extra_forbidden", ("foo",), MSG_EXTRA),
        (
            {"reader_config": None},
            "model_type",
            ("reader_config",),
            "Input should be an object",
        ),
        (
            {"reader_config": {"seed": 1, "io_backend": "x"}},
            "literal_error",
            ("reader_config", "io_backend"),
            MSG_BACKEND,
        ),
        (
            {"reader_config": {"seed": 1, "bogus": 1}},
            "extra_forbidden",
            ("reader_config", "bogus"),
            MSG_EXTRA,
        ),
    ],
)
def test_dataset_configuration_rejects(
    cache_dir: Path,
    change: dict[str, Any],
    error_type: str,
    loc: tuple[Any, ...],
    msg: str,
) -> None:
    data = dataset_json(cache_dir)
    data.update(change)
    with pytest.raises(ValidationError) as exc_info:
        DatasetConfiguration.model_validate_json(json.dumps(data))
    assert errors_of(exc_info) == [(error_type, loc, msg)]
    assert str(exc_info.value).startswith("1 validation error for DatasetConfiguration\n")


@pytest.mark.parametrize("key", ["reader_config", "num_workers", "cache_paths"])
def test_dataset_configuration_required_keys(cache_dir: Path, key: str) -> None:
    data = dataset_json(cache_dir)
    del data[key]
    with pytest.raises(ValidationError) as exc_info:
        DatasetConfiguration.model_validate_json(json.dumps(data))
    assert errors_of(exc_info) == [("missing", (key,), "Field required")]


def test_dataset_configuration_cache_paths_must_be_directories(cache_dir: Path) -> None:
    not_a_dir = cache_dir / "file"
    not_a_dir.write_bytes(b"")
    for path in (cache_dir / "missing", not_a_dir):
        data = dataset_json(cache_dir)
        data["cache_paths"] = [str(path)]
        with pytest.raises(ValidationError) as exc_info:
            DatasetConfiguration.model_validate_json(json.dumps(data))
        # pydantic also reports the emptied tuple, exactly as in the reference.
        assert errors_of(exc_info) == [
            (
                "path_not_directory",
                ("cache_paths", 0),
                "Path does not point to a directory",
            ),
            ("too_short", ("cache_paths",), MSG_TOO_SHORT),
        ]


def test_dataset_configuration_is_strict_in_python(cache_dir: Path) -> None:
    with pytest.raises(ValidationError) as exc_info:
        DatasetConfiguration(
            cache_paths=[cache_dir],  # type: ignore[arg-type]
            reader_config=ReaderConfig(seed=1),
            num_workers=1,
            epoch_len=1,
            row_count=1,
        )
    assert errors_of(exc_info) == [
        ("tuple_type", ("cache_paths",), "Input should be a valid tuple")
    ]


# --------------------------------------------------------------------------------------
# Records: reprs, fields, match, hashing, pickling


def test_seed_example_result_repr() -> None:
    results = [CacheWriteSuccess("text_records_v1", Path("cache_text/text_records_v1"))]
    assert repr(results) == (
        "[CacheWriteSuccess(source_name='text_records_v1', "
        "path=PosixPath('cache_text/text_records_v1'))]"
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (CacheInput(b"ab", {"a": 1}), "CacheInput(data=b'ab', metadata={'a': 1})"),
        (
            CachedSample(b"x", {"k": 1.5}, 3, 4),
            "CachedSample(data=b'x', metadata={'k': 1.5}, cache_id=3, sample_id=4)",
        ),
        (
            CacheWriteError("source[0]", "boom"),
            "CacheWriteError(source_name='source[0]', message='boom')",
        ),
        (
            CacheSourcesDatasetSuccess(None, []),  # type: ignore[arg-type]
            "CacheSourcesDatasetSuccess(dataset=None, results=[])",
        ),
        (
            CacheSourcesDatasetError([CacheWriteError("a", "b")], "no caches were written: a: b"),
            "CacheSourcesDatasetError(results=[CacheWriteError(source_name='a', "
            "message='b')], message='no caches were written: a: b')",
        ),
        (Ok(1), "Ok(value=1)"),
        (Err("e"), "Err(error='e')"),
        (Ok[int](2), "Ok(value=2)"),
        (
            ManifestUpdateEntry(Path("/a/manifest.json"), 5, "updated"),
            "ManifestUpdateEntry(path=PosixPath('/a/manifest.json'), cache_id=5, status='updated')",
        ),
        (ManifestUpdateReport(()), "ManifestUpdateReport(entries=())"),
        (
            Ok(
                ManifestUpdateReport((ManifestUpdateEntry(Path("/a/manifest.json"), 5, "updated"),))
            ),
            "Ok(value=ManifestUpdateReport(entries=(ManifestUpdateEntry("
            "path=PosixPath('/a/manifest.json'), cache_id=5, status='updated'),)))",
        ),
        (
            AbsentManifestTarget("unsupported migration request"),
            "AbsentManifestTarget(reason='unsupported migration request')",
        ),
        (
            ManifestUpdateError(
                AbsentManifestTarget("unsupported migration request"),
                "unsupported manifest migration target; expected integer 3",
                (),
            ),
            "ManifestUpdateError(path=AbsentManifestTarget(reason='unsupported "
            "migration request'), message='unsupported manifest migration target; "
            "expected integer 3', entries=())",
        ),
        (
            ManifestUpdateError(Path("/x"), "m"),
            "ManifestUpdateError(path=PosixPath('/x'), message='m', entries=())",
        ),
    ],
)
def test_record_reprs(value: object, text: str) -> None:
    assert repr(value) == text
    assert str(value) == text


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (CacheInput, ("data", "metadata")),
        (CachedSample, ("data", "metadata", "cache_id", "sample_id")),
        (CacheWriteSuccess, ("source_name", "path")),
        (CacheWriteError, ("source_name", "message")),
        (CacheSourcesDatasetSuccess, ("dataset", "results")),
        (CacheSourcesDatasetError, ("results", "message")),
        (Ok, ("value",)),
        (Err, ("error",)),
        (ManifestUpdateEntry, ("path", "cache_id", "status")),
        (ManifestUpdateReport, ("entries",)),
        (AbsentManifestTarget, ("reason",)),
        (ManifestUpdateError, ("path", "message", "entries")),
    ],
)
def test_record_fields_and_match_args(cls: Any, fields: tuple[str, ...]) -> None:
    assert cls.__match_args__ == fields
    if cls in NAMED_TUPLES:
        assert cls._fields == fields
        assert cls._field_defaults == {}
    else:
        assert tuple(f.name for f in dataclasses.fields(cls)) == fields


def test_named_tuples_need_every_field() -> None:
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'metadata'"):
        CacheInput(b"")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="takes 3 positional arguments but 4 were given"):
        CacheInput(b"x", {}, 3)  # type: ignore[call-arg]
    with pytest.raises(
        TypeError,
        match="missing 3 required positional arguments: 'metadata', 'cache_id', and 'sample_id'",
    ):
        CachedSample(b"x")  # type: ignore[call-arg]


def test_match_like_the_seed_example() -> None:
    results = [CacheWriteSuccess("a", Path("b"))]
    outcome: CacheSourcesDatasetResult = CacheSourcesDatasetSuccess(
        "dataset",  # type: ignore[arg-type]
        results,
    )
    match outcome:
        case CacheSourcesDatasetSuccess(dataset=dataset, results=got):
            assert dataset == "dataset"
            assert got is results
        case failure:
            pytest.fail(f"unexpected {failure!r}")
    outcome = CacheSourcesDatasetError([], "no cache sources were provided")
    match outcome:
        case CacheSourcesDatasetSuccess():
            pytest.fail("an error matched the success pattern")
        case CacheSourcesDatasetError(results, message):
            assert (results, message) == ([], "no cache sources were provided")


def test_match_write_results_positionally() -> None:
    seen = []
    for result in [CacheWriteSuccess("a", Path("b")), CacheWriteError("c", "d")]:
        match result:
            case CacheWriteSuccess(name, path):
                seen.append(("ok", name, path))
            case CacheWriteError(name, message):
                seen.append(("err", name, message))
    assert seen == [("ok", "a", Path("b")), ("err", "c", "d")]


def test_match_result_values() -> None:
    def describe(result: Result[ManifestUpdateReport, ManifestUpdateError]) -> str:
        match result:
            case Ok(ManifestUpdateReport(entries)):
                return f"ok {len(entries)}"
            case Err(ManifestUpdateError(AbsentManifestTarget(reason), message, ())):
                return f"rejected {reason}: {message}"
            case Err(ManifestUpdateError(path, message, entries)):
                return f"failed {path} {message} {len(entries)}"
        return "unreachable"

    entry = ManifestUpdateEntry(Path("/m.json"), 1, "unchanged")
    assert describe(Ok(ManifestUpdateReport((entry,)))) == "ok 1"
    assert describe(Err(ManifestUpdateError(AbsentManifestTarget("r"), "m"))) == "rejected r: m"
    assert (
        describe(Err(ManifestUpdateError(Path("/m.json"), "x", (entry,)))) == "failed /m.json x 1"
    )


def test_named_tuple_equality_and_hashing() -> None:
    success = CacheWriteSuccess("a", Path("b"))
    assert success == ("a", Path("b"))
    assert hash(success) == hash(CacheWriteSuccess("a", Path("b")))
    assert success._replace(source_name="c") == CacheWriteSuccess("c", Path("b"))
    with pytest.raises(AttributeError):
        success.path = Path("x")  # type: ignore[misc]
    with pytest.raises(TypeError, match="unhashable type: 'dict'"):
        hash(CacheInput(b"", {}))
    with pytest.raises(TypeError, match="unhashable type: 'dict'"):
        hash(CachedSample(b"", {}, 0, 0))
    with pytest.raises(TypeError, match="unhashable type: 'list'"):
        hash(CacheSourcesDatasetError([], "m"))


def test_outcome_dataclasses_equality_hashing_and_frozenness() -> None:
    assert Ok(1) == Ok(1)
    assert Ok(1) == Ok(1.0)
    assert hash(Ok(1)) == hash(Ok(1.0))
    assert Ok(1) != Err(1)
    assert Ok[int](2) == Ok(2)
    assert Ok(1) != (1,)
    with pytest.raises(TypeError, match="unhashable type: 'list'"):
        hash(Ok([1]))
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field"):
        Ok(1).value = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ManifestUpdateEntry(Path("/a"), 1, "updated").status = "unchanged"  # type: ignore[misc]
    error = ManifestUpdateError(Path("/x"), "m")
    assert error.entries == ()
    assert dataclasses.fields(ManifestUpdateError)[2].default == ()
    assert hash(error) == hash(ManifestUpdateError(Path("/x"), "m", ()))
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'message'"):
        ManifestUpdateError(Path("/x"))  # type: ignore[call-arg]
    entry = ManifestUpdateEntry(Path("/a"), 1, "updated")
    assert entry.__dict__ == {"path": Path("/a"), "cache_id": 1, "status": "updated"}


@pytest.mark.parametrize(
    "value",
    [
        Ok(1),
        Err("e"),
        ManifestUpdateEntry(Path("/a/manifest.json"), 5, "durability_unknown"),
        ManifestUpdateReport((ManifestUpdateEntry(Path("/a"), 1, "updated"),)),
        AbsentManifestTarget("r"),
        ManifestUpdateError(AbsentManifestTarget("r"), "m", ()),
    ],
)
def test_outcome_dataclasses_pickle_without_the_facade(value: object) -> None:
    data = pickle.dumps(value)
    assert b"dataset_rt.records" in data
    assert pickle.loads(data) == value


def test_reference_outcome_pickle_loads() -> None:
    assert pickle.loads(REF_PICKLE_MANIFEST_ENTRY) == ManifestUpdateEntry(
        Path("/a/manifest.json"), 5, "updated"
    )
    entry = ManifestUpdateEntry(Path("/a/manifest.json"), 5, "updated")
    assert pickle.dumps(entry, protocol=4) == REF_PICKLE_MANIFEST_ENTRY


@pytest.mark.parametrize(
    "value",
    [
        CacheInput(b"ab", {"a": 1}),
        CachedSample(b"x", {"k": 1.5, "s": "t", "b": True}, 3, 4),
        CacheWriteSuccess("a", Path("b")),
        CacheWriteError("source[0]", "boom"),
        CacheSourcesDatasetError([CacheWriteError("a", "b")], "no caches were written: a: b"),
    ],
)
@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_named_tuples_pickle_round_trip(facade: ModuleType, value: object, protocol: int) -> None:
    data = pickle.dumps(value, protocol=protocol)
    assert b"dataset_rt.api" in data
    restored = pickle.loads(data)
    assert restored == value
    assert type(restored) is type(value)


def test_named_tuple_pickles_match_the_reference(facade: ModuleType) -> None:
    success = CacheWriteSuccess("a", Path("b"))
    assert pickle.dumps(success, protocol=4) == REF_PICKLE_CACHE_WRITE_SUCCESS
    assert pickle.loads(REF_PICKLE_CACHE_WRITE_SUCCESS) == success
    assert pickle.loads(REF_PICKLE_CACHED_SAMPLE) == CachedSample(b"x", {"k": 1}, 2, 3)
    error = CacheWriteError("source[0]", "boom")
    assert pickle.dumps(error, protocol=2) == REF_PICKLE_CACHE_WRITE_ERROR_P2
    assert pickle.loads(REF_PICKLE_CACHE_WRITE_ERROR_P2) == error


# --------------------------------------------------------------------------------------
# Protocols and annotations


@pytest.mark.parametrize("protocol_cls", PROTOCOLS)
def test_protocols_are_not_runtime_checkable(protocol_cls: type) -> None:
    with pytest.raises(
        TypeError,
        match="Instance and class checks can only be used with @runtime_checkable protocols",
    ):
        isinstance(object(), protocol_cls)


def test_protocols_describe_duck_types() -> None:
    class Source:
        name = "src"

        def __iter__(self) -> Iterator[CacheInput]:
            yield CacheInput(b"x", {"k": 1})

    source: CacheSource = Source()
    assert [sample.data for sample in source] == [b"x"]
    assert typing.get_type_hints(CacheSource)["name"] is str
    assert {"__iter__", "__len__"} <= set(vars(SizedTorchIterableDataset))


def test_record_annotations() -> None:
    dataset_hint = CacheSourcesDatasetSuccess.__annotations__["dataset"]
    assert dataset_hint == typing.ForwardRef("CachedDataset")
    assert typing.get_type_hints(CacheWriteSuccess) == {
        "source_name": str,
        "path": Path,
    }
    assert typing.get_type_hints(CachedSample) == {
        "data": bytes,
        "metadata": dict[str, MetadataValue],
        "cache_id": int,
        "sample_id": int,
    }
    hints = typing.get_type_hints(ManifestUpdateEntry)
    assert hints["status"] == typing.Literal["updated", "unchanged", "durability_unknown"]
    assert typing.get_type_hints(ManifestUpdateError)["path"] == (Path | AbsentManifestTarget)
