"""Edge cases where dataset_rt follows dataset-rt 0.4.8 exactly (or its compatibility
policy, SPEC section 4) that a review found apart: error texts of odd exceptions, metadata
values that only implement ``__index__`` / ``__float__``, which error wins when a row has
several faults, the parallel writer's paths and the ``dataset.json`` export.

Expected values were observed with the reference release (``tests/refenv.py``'s virtualenv)
and are hard-coded, so these tests do not need it installed.
"""

from __future__ import annotations

import json
import os
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest

import dataset_rt as drt
from tests.sources import FailingBadStr, Numbers
from tests.test_writer_errors import MidwayFailure

QUIET = drt.WriterConfig(show_progress=False)
ORDERED = drt.ReaderConfig(seed=0, shuffle=False)
VALUES_MESSAGE = "metadata values must be bool, int, float, or str"
SURROGATE_ERROR = (
    "Python error: UnicodeEncodeError: 'utf-8' codec can't encode character '\\udcff' "
    "in position 0: surrogates not allowed"
)


class Rows:
    """A source yielding one ``(b"x", row)`` sample per row."""

    def __init__(self, name: Any, rows: list[Any]) -> None:
        self.name = name
        self.rows = rows

    def __iter__(self) -> Any:
        for row in self.rows:
            yield (b"x", row)


def write(runtime: drt.DatasetRuntime, base: Path, source: Any, config: Any = QUIET) -> Any:
    [result] = runtime.write_cache(source, base, writer_config=config)
    return result


def written(runtime: drt.DatasetRuntime, base: Path, rows: list[Any]) -> Any:
    """The metadata read back and the manifest's kind of field ``a``, or the write's
    error message."""
    result = write(runtime, base, Rows("m", rows))
    if isinstance(result, drt.CacheWriteError):
        return result.message
    manifest = json.loads((result.path / "manifest.json").read_text(encoding="utf-8"))
    samples = runtime.cached_dataset([result.path], reader_config=ORDERED)
    return [s.metadata for s in samples], manifest["metadata_schema"][0]["kind"]


# ----------------------------------------------------- exceptions raised by user code


class BadStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str failed")


class StrReturnsInt(Exception):
    def __str__(self) -> Any:
        return 5


class Outer:
    class Inner(ValueError):
        pass


def _local_error() -> type[Exception]:
    class Local(Exception):
        pass

    return Local


class NameRaises:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    @property
    def name(self) -> str:
        raise self.exc

    def __iter__(self) -> Any:
        return iter([])


@pytest.mark.parametrize("num_processes", [0, 1], ids=["serial", "process"])
def test_exception_whose_str_fails_is_a_result(runtime, tmp_path: Path, num_processes: int) -> None:
    # 0.4.8: a CacheWriteError naming the exception, and the later sources still run.
    config = drt.WriterConfig(show_progress=False, num_processes=num_processes)
    results = runtime.write_cache(
        [Numbers("g1"), FailingBadStr("bad"), Numbers("g2")], tmp_path, writer_config=config
    )
    assert results == [
        drt.CacheWriteSuccess("g1", tmp_path / "g1"),
        drt.CacheWriteError("bad", "Python error: BadStrError: <exception str() failed>"),
        drt.CacheWriteSuccess("g2", tmp_path / "g2"),
    ]


@pytest.mark.parametrize(
    ("exc", "text"),
    [
        (BadStr("x"), "BadStr: <exception str() failed>"),
        (StrReturnsInt(), "StrReturnsInt: <exception str() failed>"),
        (Outer.Inner("n"), "Outer.Inner: n"),
        (_local_error()("l"), "_local_error.<locals>.Local: l"),
        (ValueError("v"), "ValueError: v"),
        (json.JSONDecodeError("m", "doc", 0), "JSONDecodeError: m: line 1 column 1 (char 0)"),
    ],
    ids=["str_raises", "str_returns_int", "nested", "local", "builtin", "module"],
)
def test_python_error_text(runtime, tmp_path: Path, exc: BaseException, text: str) -> None:
    # The class's __qualname__ (no module), as pyo3 prints it for 0.4.8.
    midway = write(runtime, tmp_path / "a", MidwayFailure("s", exc))
    assert midway == drt.CacheWriteError("s", f"Python error: {text}")
    name = write(runtime, tmp_path / "b", NameRaises(exc))
    assert name == drt.CacheWriteError("source[0]", f"Python error: {text}")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (None, "'None' is not an instance of 'str'"),
        (Outer.Inner(), "'Outer.Inner' object is not an instance of 'str'"),
        (..., "'ellipsis' object is not an instance of 'str'"),
    ],
    ids=["none", "nested_class", "ellipsis"],
)
def test_name_of_another_type(runtime, tmp_path: Path, name: Any, message: str) -> None:
    result = write(runtime, tmp_path, Rows(name, [{"a": 1}]))
    assert result == drt.CacheWriteError("source[0]", f"Python error: TypeError: {message}")


# ------------------------------------------------------------ metadata value kinds


class Index:
    def __index__(self) -> int:
        return 7


class Float:
    def __float__(self) -> float:
        return 2.5


class IntOnly:
    def __int__(self) -> int:
        return 4


class IndexAndFloat:
    def __index__(self) -> int:
        return 1

    def __float__(self) -> float:
        return 1.5


class IndexRaisesWithFloat:
    def __index__(self) -> int:
        raise ValueError("no")

    def __float__(self) -> float:
        return 3.5


class IndexRaises:
    def __index__(self) -> int:
        raise ValueError("no")


class FloatReturnsInt:
    def __float__(self) -> Any:
        return 3


class IndexReturnsBool:
    def __index__(self) -> int:
        return True


class StrWithIndex(str):
    def __index__(self) -> int:
        return 5


class StrWithFloat(str):
    def __float__(self) -> float:
        return 5.5


class FloatWithIndex(float):
    def __index__(self) -> int:
        return 9


class IntWithFloat(int):
    def __float__(self) -> float:
        return 0.25


class IndexOutsideInt64:
    def __index__(self) -> int:
        return 2**64


# value -> what 0.4.8 stores (value read back, manifest kind) or its error message
VALUE_KINDS = {
    "0d_int_array": (np.array(3), ([{"a": 3}], "int")),
    "0d_int8_array": (np.array(-3, dtype=np.int8), ([{"a": -3}], "int")),
    "0d_float_array": (np.array(1.5), ([{"a": 1.5}], "float")),
    "0d_float32_array": (np.array(1.5, dtype=np.float32), ([{"a": 1.5}], "float")),
    # a bool array has no __index__ (numpy refuses), but __float__
    "0d_bool_array": (np.array(True), ([{"a": 1.0}], "float")),
    "0d_object_array": (np.array(3, dtype=object), ([{"a": 3.0}], "float")),
    "0d_str_array": (np.array("s"), VALUES_MESSAGE),
    "1_element_array": (np.array([3]), VALUES_MESSAGE),
    "index": (Index(), ([{"a": 7}], "int")),
    "float": (Float(), ([{"a": 2.5}], "float")),
    "int_only": (IntOnly(), VALUES_MESSAGE),
    "index_and_float": (IndexAndFloat(), ([{"a": 1}], "int")),
    "index_raises_with_float": (IndexRaisesWithFloat(), ([{"a": 3.5}], "float")),
    "index_raises": (IndexRaises(), VALUES_MESSAGE),
    "float_returns_int": (FloatReturnsInt(), VALUES_MESSAGE),
    "index_returns_bool": (IndexReturnsBool(), ([{"a": 1}], "int")),
    "str_with_index": (StrWithIndex("s"), ([{"a": 5}], "int")),
    "str_with_float": (StrWithFloat("t"), ([{"a": 5.5}], "float")),
    "float_with_index": (FloatWithIndex(1.5), ([{"a": 9}], "int")),
    "int_with_float": (IntWithFloat(3), ([{"a": 3}], "int")),
    "numpy_str_of_a_number": (np.str_("1.5"), ([{"a": "1.5"}], "string")),
    "numpy_bytes": (np.bytes_(b"1"), VALUES_MESSAGE),
    "numpy_complex64": (np.complex64(1 + 2j), ([{"a": 1.0}], "float")),
    "numpy_complex128": (np.complex128(2), ([{"a": 2.0}], "float")),
    "numpy_timedelta64": (np.timedelta64(5), ([{"a": 5.0}], "float")),
    "complex": (1j, VALUES_MESSAGE),
}


@pytest.mark.parametrize(("value", "expected"), VALUE_KINDS.values(), ids=VALUE_KINDS.keys())
def test_values_by_protocol(runtime, tmp_path: Path, value: Any, expected: Any) -> None:
    # 0.4.8 tries bool, then an int64 through __index__, then a float through __float__
    # (or __index__), then str; errors of __index__ / __float__ only mean "not this kind".
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # __index__ returning a bool
        assert written(runtime, tmp_path, [{"a": value}]) == expected


@pytest.mark.parametrize(
    ("first", "later", "expected"),
    [
        (1, np.array(2), ([{"a": 1}, {"a": 2}], "int")),
        (1.0, np.array(2.5), ([{"a": 1.0}, {"a": 2.5}], "float")),
        (1.5, np.array(True), ([{"a": 1.5}, {"a": 1.0}], "float")),
        (1, np.array(True), "metadata field 'a' expected int, got float"),
        (1, FloatWithIndex(2.5), ([{"a": 1}, {"a": 9}], "int")),
        ("a", StrWithIndex("b"), "metadata field 'a' expected string, got int"),
    ],
    ids=[
        "int_then_array",
        "float_then_array",
        "float_then_bool_array",
        "drift",
        "int_then_float_with_index",
        "str_then_str_with_index",
    ],
)
def test_values_by_protocol_in_a_later_row(
    runtime, tmp_path: Path, first: Any, later: Any, expected: Any
) -> None:
    assert written(runtime, tmp_path, [{"a": first}, {"a": later}]) == expected


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        # 0.4.8 stores these as floats; policy 3 rejects them, whatever the field's kind.
        ([{"a": 1.5}, {"a": 2**64}], "metadata field 'a' is outside the int64 range"),
        ([{"a": 1.5}, {"a": -(2**63) - 1}], "metadata field 'a' is outside the int64 range"),
        ([{"a": 1.5}, {"a": np.uint64(2**63)}], "metadata field 'a' is outside the int64 range"),
        ([{"a": "s"}, {"a": 2**63}], "metadata field 'a' is outside the int64 range"),
        ([{"a": IndexOutsideInt64()}], "metadata field 'a' is outside the int64 range"),
        # too large for a float as well: 0.4.8's own value error
        ([{"a": 10**400}], VALUES_MESSAGE),
        ([{"a": 1}, {"a": 10**400}], VALUES_MESSAGE),
        ([{"a": 1.5}, {"a": -(10**400)}], VALUES_MESSAGE),
        ([{"a": 1}] * 100 + [{"a": 10**400}], VALUES_MESSAGE),
    ],
    ids=[
        "float_then_2**64",
        "float_then_-2**63-1",
        "float_then_np.uint64",
        "str_then_2**63",
        "index_2**64",
        "10**400",
        "int_then_10**400",
        "float_then_-10**400",
        "bulk_int_then_10**400",
    ],
)
def test_ints_outside_int64(runtime, tmp_path: Path, rows: list[Any], message: str) -> None:
    assert written(runtime, tmp_path, rows) == message


# ------------------------------------------------------ which fault of a row wins


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        # entry by entry in dict order: the key's type and UTF-8, then the value's kind
        ([{"a": [1], 1: 1}], VALUES_MESSAGE),
        ([{1: 1, "a": [1]}], "metadata keys must be strings"),
        ([{"a": [1], "\udcff": 1}], VALUES_MESSAGE),
        ([{"\udcff": 1, 1: 1}], SURROGATE_ERROR),
        ([{"a": "\udcff", 1: 1}], VALUES_MESSAGE),
        # ... before the schema and this project's checks
        ([{"weight": 1.0, "b": "\udcff"}], VALUES_MESSAGE),
        ([{"weight": 1.0, "b": 10**400}], VALUES_MESSAGE),
        ([{"a": 2**64, "b": 10**400}], VALUES_MESSAGE),
        ([{"a": 1}, {1: 1}], "metadata keys must be strings"),
        ([{"a": 1}, {"a": 1, 1: 2}], "metadata keys must be strings"),
        ([{"a": 1, "b": 1}, {"a": [1]}], VALUES_MESSAGE),
        ([{"a": 1}, {"a": 1, "b": None}], VALUES_MESSAGE),
        ([{"a": 1, "b": 2}, {"a": 1.5, "b": None}], VALUES_MESSAGE),
        ([{"a": 1, "b": 1}, {"a": "x", "b": 10**400}], VALUES_MESSAGE),
        ([{"a": 1, "b": "s"}, {"a": 2**64, "b": "\udcff"}], VALUES_MESSAGE),
        ([{"a": 1.0, "b": "s"}, {"a": float("nan"), "b": "\udcff"}], VALUES_MESSAGE),
        ([{"a": 1, "b": 1}, {"a": 1, "\udcff": 1}], SURROGATE_ERROR),
        # the same on the bulk path (a batch of plain values checked after the pull)
        ([{"a": 1, "b": "s"}] * 100 + [{"a": 2**64, "b": "\udcff"}], VALUES_MESSAGE),
    ],
    ids=[
        "bad_value_then_int_key",
        "int_key_then_bad_value",
        "bad_value_then_surrogate_key",
        "surrogate_key_then_int_key",
        "surrogate_value_then_int_key",
        "reserved_key_and_surrogate_value",
        "reserved_key_and_10**400",
        "2**64_and_10**400",
        "later_int_key_same_count",
        "later_int_key_extra",
        "later_bad_value_and_missing_key",
        "later_bad_value_and_extra_key",
        "later_drift_and_bad_value",
        "later_drift_and_10**400",
        "later_2**64_and_surrogate_value",
        "later_nan_and_surrogate_value",
        "later_missing_and_surrogate_key",
        "bulk_2**64_and_surrogate_value",
    ],
)
def test_first_fault_of_a_row(runtime, tmp_path: Path, rows: list[Any], message: str) -> None:
    assert written(runtime, tmp_path, rows) == message


# ----------------------------------------------------------------- parallel paths


def test_parallel_existing_destination_names_the_resolved_path(
    runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0.4.8's parallel writer works under path.resolve(): its messages name that path
    # (the serial writer's name the path as given); a success keeps the path as given.
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    monkeypatch.chdir(tmp_path)
    config = drt.WriterConfig(show_progress=False, num_processes=1)
    assert write(runtime, Path("link"), Numbers("s", count=2), config) == drt.CacheWriteSuccess(
        "s", Path("link/s")
    )
    again = write(runtime, Path("link"), Numbers("s", count=2), config)
    resolved = Path(os.path.realpath(tmp_path)) / "real" / "s"
    assert again == drt.CacheWriteError("s", f"cache path already exists: {resolved}")
    serial = write(runtime, Path("link"), Numbers("s", count=2))
    assert serial == drt.CacheWriteError("s", "cache path already exists: link/s")


# ---------------------------------------------------------------- dataset.json


@pytest.fixture
def two_caches(runtime, tmp_path: Path) -> tuple[Path, Path]:
    results = runtime.write_cache(
        [Numbers("a", count=5), Numbers("b", count=3)], tmp_path / "caches", writer_config=QUIET
    )
    return results[0].path, results[1].path


def test_dump_config_exports_the_caches_read(runtime, tmp_path: Path, two_caches) -> None:
    # Rebinding the attribute changes nothing the dataset reads, nor its export (0.4.8).
    first, second = two_caches
    config = drt.ReaderConfig(seed=42, shuffle=True)
    dataset = runtime.cached_dataset([first], reader_config=config)
    dataset.cache_paths = [second]
    dataset.reader_config = drt.ReaderConfig(seed=7, shuffle=False)
    (tmp_path / "export").mkdir()
    path = dataset.dump_config(tmp_path / "export")
    exported = json.loads(path.read_text())
    assert exported["cache_paths"] == [str(first)]
    assert (exported["reader_config"]["seed"], exported["reader_config"]["shuffle"]) == (42, True)
    restored = drt.CachedDataset.from_config(path)
    assert restored.cache_paths == [first]
    assert restored.reader_config == config
    assert len(restored) == 5
    # The stream state describes the stream read, too.
    assert (dataset.state_dict()["seed"], dataset.state_dict()["shuffle"]) == (42, True)


@pytest.mark.parametrize("kind", ["missing", "directory", "dangling_link"])
def test_from_config_without_metadata_file(runtime, tmp_path: Path, two_caches, kind: str) -> None:
    # 0.4.8 validates the path as a pydantic FilePath.
    dataset = runtime.cached_dataset([two_caches[0]], reader_config=drt.ReaderConfig(seed=1))
    path = dataset.dump_config(tmp_path)
    metadata = tmp_path / "metadata.arrow"
    metadata.unlink()
    if kind == "directory":
        metadata.mkdir()
    elif kind == "dangling_link":
        metadata.symlink_to("nowhere")
    with pytest.raises(pydantic.ValidationError) as caught:
        drt.CachedDataset.from_config(path)
    [error] = caught.value.errors()
    assert (error["type"], error["msg"], error["input"]) == (
        "path_not_file",
        "Path does not point to a file",
        metadata,
    )


def _duck_writer_config(**changes: Any) -> types.SimpleNamespace:
    """A duck-typed writer config (not a pydantic model, so nothing validated it)."""
    fields: dict[str, Any] = dict(
        num_processes=0,
        process_timeout_seconds=3600.0,
        prefetch_size=4,
        max_shard_bytes=1000,
        shard_compression=types.SimpleNamespace(algo="lz4", ratio=1.0),
        show_progress=False,
        validate_cache=False,
        profiler=types.SimpleNamespace(enabled=False, path=Path("p.json")),
    )
    fields.update(changes)
    return types.SimpleNamespace(**{k: v for k, v in fields.items() if v is not _ABSENT})


_ABSENT = object()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"shard_compression": types.SimpleNamespace(algo="lz4", ratio="2")},
            "Python error: TypeError: must be real number, not str",
        ),
        (
            {"shard_compression": types.SimpleNamespace(algo=None, ratio=1.0)},
            "Python error: TypeError: 'None' is not an instance of 'str'",
        ),
        (
            {"show_progress": "no"},
            "Python error: TypeError: 'str' object is not an instance of 'bool'",
        ),
        (
            {"show_progress": _ABSENT},
            "Python error: AttributeError: 'types.SimpleNamespace' object has no attribute "
            "'show_progress'",
        ),
    ],
    ids=["ratio_str", "algo_none", "show_progress_str", "show_progress_missing"],
)
def test_duck_typed_writer_config_is_extracted_as_0_4_8_does(
    runtime, tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    # Text is never parsed as a number, nor a string taken for a true flag.
    with pytest.raises(RuntimeError) as caught:
        runtime.write_cache(
            Numbers("s", count=1), tmp_path / "b", writer_config=_duck_writer_config(**changes)
        )
    assert str(caught.value) == message
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seed": "1"}, "'str' object cannot be interpreted as an integer"),
        ({"prefetch_size": 2.0}, "'float' object cannot be interpreted as an integer"),
        ({"shuffle": "no"}, "'str' object is not an instance of 'bool'"),
        ({"validate_cache": None}, "'None' is not an instance of 'bool'"),
    ],
    ids=["seed_str", "prefetch_float", "shuffle_str", "validate_none"],
)
def test_duck_typed_reader_config_is_extracted_as_0_4_8_does(
    runtime, two_caches, changes: dict[str, Any], message: str
) -> None:
    fields = dict(seed=1, prefetch_size=2, shuffle=False, validate_cache=False) | changes
    with pytest.raises(TypeError) as caught:
        runtime.cached_dataset([two_caches[0]], reader_config=types.SimpleNamespace(**fields))
    assert str(caught.value) == message
    # np.bool_ flags are bools (pyo3 takes them too).
    fields = dict(seed=1, prefetch_size=2, shuffle=np.bool_(False), validate_cache=False)
    dataset = runtime.cached_dataset([two_caches[0]], reader_config=types.SimpleNamespace(**fields))
    assert [s.sample_id for s in dataset] == [0, 1, 2, 3, 4]
