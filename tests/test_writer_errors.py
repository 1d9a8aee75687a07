"""Writer inputs, failures and reuse behave like dataset-rt 0.4.8, with the policy fixes.

Every row of shared/reference/dataset-rt-0.4.8.md table 4.1 (serial mode) and section 4.2
(reuse) is a test here: the returned result (or the raised exception: type, exact message,
identity for interrupts) and what is left on disk. Where SPEC.md "Compatibility policy"
fixes the reference, the policy's behaviour and message are asserted instead (payloads must
be bytes-like, finite floats, int64 range, reserved keys and name ``tmp``, staging always
removed, reuse failures as values, interrupts unchanged).

Disk rules (SPEC section 3 + policy 6/10): a failure publishes nothing and never leaves a
staging directory behind; ``<base>/tmp/`` itself may exist. Existing paths are untouched.
Expected values were observed with the reference release and are hard-coded, so the tests
do not need it installed.
"""

from __future__ import annotations

import array
import enum
import fractions
import json
import math
import os
import types
from collections import OrderedDict
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dataset_rt as drt
from dataset_rt.config import DEFAULT_WRITER_CONFIG, ShardCompression, WriterConfig
from tests.conftest import snapshot

QUIET = WriterConfig(show_progress=False)
VALIDATING = WriterConfig(show_progress=False, validate_cache=True)
ORDERED = drt.ReaderConfig(seed=0, shuffle=False)

ONE_ROW = [(b"payload", {"k": 1})]

# ---------------------------------------------------------------------------- helpers


class Source:
    """A named source over fixed items; counts how often it was iterated."""

    def __init__(self, name: Any, items: Any = ONE_ROW) -> None:
        self.name = name
        self.items = list(items)
        self.iterations = 0

    def __iter__(self) -> Any:
        self.iterations += 1
        return iter(self.items)


class MidwayFailure:
    """Yields one sample, then raises ``exc``."""

    def __init__(self, name: str, exc: BaseException) -> None:
        self.name = name
        self.exc = exc

    def __iter__(self) -> Any:
        yield (b"a", {"k": 1})
        raise self.exc


class RaisesInIter:
    """``iter(source)`` itself raises ``exc``."""

    def __init__(self, name: str, exc: BaseException) -> None:
        self.name = name
        self.exc = exc

    def __iter__(self) -> Any:
        raise self.exc


class FirstNextFails:
    """A generator whose first ``next()`` raises ``exc``."""

    def __init__(self, name: str, exc: BaseException) -> None:
        self.name = name
        self.exc = exc

    def __iter__(self) -> Any:
        raise self.exc
        yield  # pragma: no cover - makes this a generator


class NotIter:
    name = "notiter"


class NonIteratorIter:
    name = "nonit"

    def __iter__(self) -> Any:
        return 5


class NoName:
    def __iter__(self) -> Any:
        return iter(ONE_ROW)


class NeverIterate:
    """A source that must be reused, never iterated."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __iter__(self) -> Any:
        raise AssertionError(f"source {self.name!r} must not be iterated")


class OnlyDunderBytes:
    def __bytes__(self) -> bytes:
        return b"abc"


class BytesSubclass(bytes):
    pass


class DictSubclass(dict):
    pass


class Color(enum.IntEnum):
    RED = 7


def tree(base: Path) -> list[str] | None:
    """Sorted relative paths under ``base`` (None when it does not exist)."""
    if not os.path.lexists(base):
        return None
    return sorted(str(p.relative_to(base)) for p in base.rglob("*"))


def published(base: Path) -> list[str]:
    """Top-level entries of ``base`` other than the staging root ``tmp``."""
    if not base.exists():
        return []
    return sorted(p.name for p in base.iterdir() if p.name != "tmp")


def assert_no_staging(base: Path) -> None:
    """``<base>/tmp/`` may exist, but must hold no staging directory (SPEC 3, policy 6)."""
    staging_root = base / "tmp"
    if not os.path.lexists(staging_root):
        return
    assert staging_root.is_dir() and not staging_root.is_symlink()
    leftovers = [p.name for p in staging_root.iterdir() if p.is_dir() or not p.name.startswith(".")]
    assert leftovers == [], f"staging leftovers in {staging_root}: {leftovers}"


def assert_failed_cleanly(base: Path, before: list[str] | None = None) -> None:
    """Nothing new was published and no staging directory remains."""
    assert published(base) == (before or [])
    assert_no_staging(base)


def write_one(runtime: drt.DatasetRuntime, base: Path, source: Any, config: Any = QUIET) -> Any:
    results = runtime.write_cache(source, base, writer_config=config)
    assert isinstance(results, list) and len(results) == 1
    return results[0]


def read_back(
    runtime: drt.DatasetRuntime, path: Path, validate: bool = False
) -> list[drt.CachedSample]:
    dataset = runtime.cached_dataset(
        [path], reader_config=drt.ReaderConfig(seed=0, shuffle=False, validate_cache=validate)
    )
    return list(dataset)


def schema(path: Path) -> list[dict[str, str]]:
    return json.loads((path / "manifest.json").read_text(encoding="utf-8"))["metadata_schema"]


def assert_published_cache(base: Path, name: str) -> None:
    cache = base / name
    assert sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) == [
        "index.bin",
        "manifest.json",
        "metadata.arrow",
        "shards",
        "shards/000000.bin",
    ]


# ------------------------------------------------------------------------- payloads

REJECTED_PAYLOADS = {
    "str": "abc",
    "none": None,
    "float": 1.5,
    "negative_int": -1,
    "list_with_256": [1, 256],
    "dunder_bytes_only": OnlyDunderBytes(),
    # Policy 3: the reference turns these into bytes (bytearray(x) semantics); we reject.
    "int_5": 5,
    "int_0": 0,
    "true": True,
    "false": False,
    "list_of_ints": [1, 2, 3],
    "empty_list": [],
    "range": range(3),
    "tuple_of_ints": (1, 2),
}


@pytest.mark.parametrize("payload", REJECTED_PAYLOADS.values(), ids=REJECTED_PAYLOADS.keys())
def test_non_bytes_like_payload_is_rejected(runtime, tmp_path: Path, payload: Any) -> None:
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("p", [(payload, {"k": 1})]))
    assert result == drt.CacheWriteError("p", "data must be bytes-like")
    assert type(result) is drt.CacheWriteError
    assert_failed_cleanly(base)


def test_non_bytes_like_payload_in_a_later_row_is_rejected(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    items = [(b"ok", {"k": i}) for i in range(10)] + [(5, {"k": 10})]
    assert write_one(runtime, base, Source("p", items)) == drt.CacheWriteError(
        "p", "data must be bytes-like"
    )
    assert_failed_cleanly(base)


ACCEPTED_PAYLOADS = {
    "bytes": (b"abc", b"abc"),
    "empty_bytes": (b"", b""),
    "bytearray": (bytearray(b"\x00\xffz"), b"\x00\xffz"),
    "memoryview": (memoryview(b"abc"), b"abc"),
    "memoryview_slice": (memoryview(b"xabcx")[1:4], b"abc"),
    "bytes_subclass": (BytesSubclass(b"sub"), b"sub"),
    "numpy_uint8": (np.array([1, 2, 255], dtype=np.uint8), b"\x01\x02\xff"),
    "array_i": (array.array("i", [1, -2]), array.array("i", [1, -2]).tobytes()),
}


@pytest.mark.parametrize(
    ("payload", "raw"), ACCEPTED_PAYLOADS.values(), ids=ACCEPTED_PAYLOADS.keys()
)
def test_bytes_like_payloads_round_trip_raw_bytes(
    runtime, tmp_path: Path, payload: Any, raw: bytes
) -> None:
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("p", [(payload, {"k": 1}), (b"tail", {"k": 2})]))
    assert result == drt.CacheWriteSuccess("p", base / "p")
    assert_published_cache(base, "p")
    assert_no_staging(base)
    samples = read_back(runtime, base / "p")
    assert [s.data for s in samples] == [raw, b"tail"]
    assert all(type(s.data) is bytes for s in samples)


def test_all_accepted_payload_kinds_in_one_cache(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    items = [(payload, {"i": i}) for i, (payload, _) in enumerate(ACCEPTED_PAYLOADS.values())]
    assert write_one(runtime, base, Source("mixed", items)) == drt.CacheWriteSuccess(
        "mixed", base / "mixed"
    )
    assert [s.data for s in read_back(runtime, base / "mixed")] == [
        raw for _, raw in ACCEPTED_PAYLOADS.values()
    ]


# ------------------------------------------------------------------------- metadata

REJECTED_VALUES = {
    "list": [1],
    "dict": {"a": 1},
    "none": None,
    "bytes": b"x",
    "path": Path("x"),
    "complex": 1j,
    "set": {1},
}


@pytest.mark.parametrize("value", REJECTED_VALUES.values(), ids=REJECTED_VALUES.keys())
def test_unsupported_metadata_value(runtime, tmp_path: Path, value: Any) -> None:
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("m", [(b"x", {"k": value})]))
    assert result == drt.CacheWriteError("m", "metadata values must be bool, int, float, or str")
    assert_failed_cleanly(base)


def test_unsupported_metadata_value_in_a_later_row(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    items = [(b"x", {"k": 1}), (b"y", {"k": None})]
    result = write_one(runtime, base, Source("m", items))
    # The first row fixes the kind int; the reference reports the value check here.
    assert result == drt.CacheWriteError("m", "metadata values must be bool, int, float, or str")
    assert_failed_cleanly(base)


ACCEPTED_VALUES = {
    # value, manifest kind, value read back
    "numpy_int8": (np.int8(-3), "int", -3),
    "numpy_int32": (np.int32(-4), "int", -4),
    "numpy_int64": (np.int64(2**63 - 1), "int", 2**63 - 1),
    "numpy_uint8": (np.uint8(3), "int", 3),
    "numpy_uint64_small": (np.uint64(5), "int", 5),
    "int_enum": (Color.RED, "int", 7),
    "int64_min": (-(2**63), "int", -(2**63)),
    "int64_max": (2**63 - 1, "int", 2**63 - 1),
    "numpy_float32": (np.float32(0.5), "float", 0.5),
    "numpy_float64": (np.float64(0.25), "float", 0.25),
    "decimal": (Decimal("1.25"), "float", 1.25),
    "fraction": (fractions.Fraction(1, 4), "float", 0.25),
    "numpy_bool_true": (np.bool_(True), "bool", True),
    "numpy_bool_false": (np.bool_(False), "bool", False),
    "numpy_str": (np.str_("hi"), "string", "hi"),
    "bool": (True, "bool", True),
    "str": ("s", "string", "s"),
}


@pytest.mark.parametrize(
    ("value", "kind", "back"), ACCEPTED_VALUES.values(), ids=ACCEPTED_VALUES.keys()
)
def test_accepted_metadata_types(runtime, tmp_path: Path, value: Any, kind: str, back: Any) -> None:
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("m", [(b"x", {"k": value}), (b"y", {"k": value})]))
    assert result == drt.CacheWriteSuccess("m", base / "m")
    assert schema(base / "m") == [{"name": "k", "kind": kind}]
    for validate in (False, True):
        for sample in read_back(runtime, base / "m", validate=validate):
            assert sample.metadata == {"k": back}
            assert type(sample.metadata["k"]) is type(back)


@pytest.mark.parametrize(
    "value",
    [2**63, -(2**63) - 1, np.uint64(2**64 - 1), np.uint64(2**63), 2**64],
    ids=["2**63", "-2**63-1", "np.uint64(2**64-1)", "np.uint64(2**63)", "2**64"],
)
def test_int_outside_int64_is_rejected(runtime, tmp_path: Path, value: Any) -> None:
    # Policy 3: the reference silently stores these as floats. (10**400, too large for a
    # float too, is its value error: tests/test_compat_edges.py::test_ints_outside_int64.)
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("m", [(b"x", {"k": value})]))
    assert result == drt.CacheWriteError("m", "metadata field 'k' is outside the int64 range")
    assert_failed_cleanly(base)


def test_int_outside_int64_in_a_later_row_is_rejected(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    items = [(b"x", {"k": 1}), (b"y", {"k": 2**63})]
    result = write_one(runtime, base, Source("m", items))
    assert result == drt.CacheWriteError("m", "metadata field 'k' is outside the int64 range")
    assert_failed_cleanly(base)


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, np.float32("nan"), np.float64("inf")],
    ids=["nan", "inf", "-inf", "np.float32-nan", "np.float64-inf"],
)
def test_non_finite_float_is_rejected(runtime, tmp_path: Path, value: Any) -> None:
    # Policy 2: the reference writes these and then can never read the sample.
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("m", [(b"x", {"k": value, "a": 1})]))
    assert result == drt.CacheWriteError("m", "metadata field 'k' must be a finite float")
    assert_failed_cleanly(base)


def test_non_finite_float_in_a_later_row_is_rejected(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    items = [(b"x", {"k": 0.5}), (b"y", {"k": 1.5}), (b"z", {"k": math.nan})]
    result = write_one(runtime, base, Source("m", items))
    assert result == drt.CacheWriteError("m", "metadata field 'k' must be a finite float")
    assert_failed_cleanly(base)


@pytest.mark.parametrize("key", ["cache_id", "sample_id", "weight"])
def test_reserved_metadata_key_is_rejected(runtime, tmp_path: Path, key: str) -> None:
    # Policy 4: the reference accepts them, then get_metadata() raises DuplicateError.
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("m", [(b"x", {"a": 1, key: 1.0})]))
    assert result == drt.CacheWriteError("m", f"metadata field '{key}' is reserved")
    assert_failed_cleanly(base)


def test_reserved_lookalike_keys_are_fine(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    metadata = {"Weight": 1.0, "cache_id_": 1, "sample": 2}
    assert write_one(runtime, base, Source("m", [(b"x", metadata)])) == drt.CacheWriteSuccess(
        "m", base / "m"
    )


def test_non_str_metadata_key(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("m", [(b"x", {1: 1})]))
    assert result == drt.CacheWriteError("m", "metadata keys must be strings")
    assert_failed_cleanly(base)


@pytest.mark.parametrize(
    "metadata",
    [[("k", 1)], types.MappingProxyType({"k": 1}), None, "k"],
    ids=["list_of_pairs", "mapping_proxy", "none", "str"],
)
def test_metadata_must_be_a_dict(runtime, tmp_path: Path, metadata: Any) -> None:
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("m", [(b"x", metadata)]))
    assert result == drt.CacheWriteError("m", "metadata must be a dict")
    assert_failed_cleanly(base)


@pytest.mark.parametrize(
    "metadata", [DictSubclass(k=1), OrderedDict(k=1)], ids=["dict_subclass", "ordered_dict"]
)
def test_dict_subclasses_are_accepted(runtime, tmp_path: Path, metadata: Any) -> None:
    base = tmp_path / "base"
    assert write_one(runtime, base, Source("m", [(b"x", metadata)])) == drt.CacheWriteSuccess(
        "m", base / "m"
    )
    assert [s.metadata for s in read_back(runtime, base / "m")] == [{"k": 1}]


def test_every_row_empty_metadata(runtime, tmp_path: Path) -> None:
    """A deliberate difference (docs/compatibility.md): 0.4.8 fails with an Arrow error;
    such caches are written and read back (tests/test_empty_metadata.py)."""
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("m", [(b"x", {}), (b"y", {})]))
    assert result == drt.CacheWriteSuccess("m", base / "m")
    assert [(s.data, s.metadata) for s in read_back(runtime, base / "m")] == [
        (b"x", {}),
        (b"y", {}),
    ]


@pytest.mark.parametrize(
    "rows",
    [
        [{"k": 1}, {"k": 1, "j": 2}],
        [{"k": 1, "j": 2}, {"k": 1}],
        [{"k": 1}, {}],
        [{}, {"k": 1}],
    ],
    ids=["extra_key", "missing_key", "empty_later", "key_appears"],
)
def test_later_row_with_other_key_count(
    runtime, tmp_path: Path, rows: list[dict[str, Any]]
) -> None:
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("m", [(b"x", row) for row in rows]))
    assert result == drt.CacheWriteError("m", "metadata keys must be identical for every sample")
    assert_failed_cleanly(base)


def test_later_row_with_renamed_key(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("m", [(b"x", {"k": 1}), (b"y", {"j": 1})]))
    assert result == drt.CacheWriteError("m", "metadata field 'k' is missing")
    assert_failed_cleanly(base)


@pytest.mark.parametrize(
    ("first", "later", "message"),
    [
        (1, 1.0, "metadata field 'k' expected int, got float"),
        (1, True, "metadata field 'k' expected int, got bool"),
        (1.0, 1, "metadata field 'k' expected float, got int"),
        ("a", 1, "metadata field 'k' expected string, got int"),
    ],
    ids=["int_to_float", "int_to_bool", "float_to_int", "str_to_int"],
)
def test_metadata_type_drift(runtime, tmp_path: Path, first: Any, later: Any, message: str) -> None:
    base = tmp_path / "base"
    result = write_one(runtime, base, Source("m", [(b"x", {"k": first}), (b"y", {"k": later})]))
    assert result == drt.CacheWriteError("m", message)
    assert_failed_cleanly(base)


def test_key_order_may_differ_between_rows(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    items = [(b"x", {"b": 1, "a": "s"}), (b"y", {"a": "t", "b": 2})]
    assert write_one(runtime, base, Source("m", items)) == drt.CacheWriteSuccess("m", base / "m")
    assert schema(base / "m") == [{"name": "a", "kind": "string"}, {"name": "b", "kind": "int"}]
    assert [s.metadata for s in read_back(runtime, base / "m")] == [
        {"a": "s", "b": 1},
        {"a": "t", "b": 2},
    ]


# ---------------------------------------------------------------------- item shapes


@pytest.mark.parametrize(
    "item", [{"data": b"x", "metadata": {}}, b"x", [b"x", {"k": 1}]], ids=["dict", "bytes", "list"]
)
def test_source_must_yield_tuples(runtime, tmp_path: Path, item: Any) -> None:
    base = tmp_path / "base"
    assert write_one(runtime, base, Source("s", [item])) == drt.CacheWriteError(
        "s", "CacheSource must yield CacheInput tuples"
    )
    assert_failed_cleanly(base)


@pytest.mark.parametrize(
    "item", [(b"x",), (b"x", {"k": 1}, 3), ()], ids=["1-tuple", "3-tuple", "0-tuple"]
)
def test_cache_input_needs_data_and_metadata(
    runtime, tmp_path: Path, item: tuple[Any, ...]
) -> None:
    base = tmp_path / "base"
    assert write_one(runtime, base, Source("s", [item])) == drt.CacheWriteError(
        "s", "CacheInput must contain data and metadata"
    )
    assert_failed_cleanly(base)


def test_plain_two_tuples_and_cache_inputs_are_accepted(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    items = [
        (b"a", {"k": 1}),
        drt.CacheInput(b"b", {"k": 2}),
        drt.CacheInput(data=b"c", metadata={"k": 3}),
    ]
    assert write_one(runtime, base, Source("s", items)) == drt.CacheWriteSuccess("s", base / "s")
    assert [(s.data, s.metadata) for s in read_back(runtime, base / "s")] == [
        (b"a", {"k": 1}),
        (b"b", {"k": 2}),
        (b"c", {"k": 3}),
    ]


def test_empty_source(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    assert write_one(runtime, base, Source("e", [])) == drt.CacheWriteError(
        "e", "cache source yielded no samples"
    )
    assert_failed_cleanly(base)


# ------------------------------------------------------------------ source failures


def test_iteration_raises_midway(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    result = write_one(runtime, base, MidwayFailure("mid", RuntimeError("midway failure")))
    assert result == drt.CacheWriteError("mid", "Python error: RuntimeError: midway failure")
    assert_failed_cleanly(base)


def test_iteration_raises_midway_after_many_batches(runtime, tmp_path: Path) -> None:
    class Long:
        name = "long"

        def __iter__(self) -> Any:
            for i in range(10_000):
                yield (b"x" * 10, {"i": i})
            raise OSError("disk gone")

    base = tmp_path / "base"
    config = WriterConfig(show_progress=False, max_shard_bytes=4096, prefetch_size=7)
    result = write_one(runtime, base, Long(), config)
    assert result == drt.CacheWriteError("long", "Python error: OSError: disk gone")
    assert_failed_cleanly(base)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (RaisesInIter("imm", ValueError("cannot start")), "Python error: ValueError: cannot start"),
        (NotIter(), "Python error: TypeError: 'NotIter' object is not iterable"),
        (NonIteratorIter(), "Python error: TypeError: iter() returned non-iterator of type 'int'"),
        (FirstNextFails("gen", ValueError("first")), "Python error: ValueError: first"),
    ],
    ids=["iter_raises", "not_iterable", "non_iterator", "first_next_raises"],
)
def test_iter_source_failure_leaves_no_staging(
    runtime, tmp_path: Path, source: Any, message: str
) -> None:
    # Policy 6: the reference leaves tmp/<name>/shards/000000.bin behind in the first three.
    base = tmp_path / "base"
    result = write_one(runtime, base, source)
    assert result == drt.CacheWriteError(source.name, message)
    assert_failed_cleanly(base)


def test_failing_source_in_the_middle(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    first, last = Source("a"), Source("c")
    results = runtime.write_cache(
        [first, MidwayFailure("b", RuntimeError("boom")), last], base, writer_config=QUIET
    )
    assert results == [
        drt.CacheWriteSuccess("a", base / "a"),
        drt.CacheWriteError("b", "Python error: RuntimeError: boom"),
        drt.CacheWriteSuccess("c", base / "c"),
    ]
    assert published(base) == ["a", "c"]
    assert_no_staging(base)
    assert first.iterations == last.iterations == 1


def test_good_empty_good(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    results = runtime.write_cache(
        [Source("a"), Source("b", []), Source("c")], base, writer_config=QUIET
    )
    assert results == [
        drt.CacheWriteSuccess("a", base / "a"),
        drt.CacheWriteError("b", "cache source yielded no samples"),
        drt.CacheWriteSuccess("c", base / "c"),
    ]
    assert published(base) == ["a", "c"]
    assert_published_cache(base, "a")
    assert_published_cache(base, "c")
    assert_no_staging(base)


def test_every_kind_of_failure_in_one_call(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    sources = [
        Source("ok1"),
        Source("bad_payload", [(5, {"k": 1})]),
        RaisesInIter("bad_iter", ValueError("no")),
        Source("", ONE_ROW),
        Source("bad_meta", [(b"x", {"k": math.inf})]),
        Source("ok2"),
    ]
    results = runtime.write_cache(sources, base, writer_config=QUIET)
    assert results == [
        drt.CacheWriteSuccess("ok1", base / "ok1"),
        drt.CacheWriteError("bad_payload", "data must be bytes-like"),
        drt.CacheWriteError("bad_iter", "Python error: ValueError: no"),
        drt.CacheWriteError("source[3]", "CacheSource.name must not be empty"),
        drt.CacheWriteError("bad_meta", "metadata field 'k' must be a finite float"),
        drt.CacheWriteSuccess("ok2", base / "ok2"),
    ]
    assert published(base) == ["ok1", "ok2"]
    assert_no_staging(base)


# ------------------------------------------------------------------------ interrupts


def _interrupts() -> list[Any]:
    return [
        pytest.param(lambda: KeyboardInterrupt("x"), id="KeyboardInterrupt"),
        pytest.param(lambda: SystemExit(3), id="SystemExit(3)"),
        pytest.param(lambda: SystemExit(None), id="SystemExit(None)"),
    ]


@pytest.mark.parametrize("make", _interrupts())
@pytest.mark.parametrize(
    "where", [MidwayFailure, RaisesInIter, FirstNextFails], ids=["midway", "iter", "first"]
)
def test_interrupt_propagates_unchanged(runtime, tmp_path: Path, make: Any, where: Any) -> None:
    # Policy 7: the same object, exit code kept; staging removed; earlier sources stay
    # published; later sources are not attempted.
    base = tmp_path / "base"
    exc = make()
    earlier, later = Source("a"), Source("c")
    with pytest.raises(BaseException) as info:
        runtime.write_cache([earlier, where("b", exc), later], base, writer_config=QUIET)
    assert info.value is exc
    assert info.value.args == exc.args
    if isinstance(exc, SystemExit):
        assert info.value.code == (3 if exc.args == (3,) else None)
    assert published(base) == ["a"]
    assert_published_cache(base, "a")
    assert_no_staging(base)
    assert later.iterations == 0
    # The earlier cache is complete and readable.
    assert [s.data for s in read_back(runtime, base / "a")] == [b"payload"]


def test_interrupt_from_from_cache_sources(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    exc = KeyboardInterrupt("x")
    with pytest.raises(KeyboardInterrupt) as info:
        runtime.from_cache_sources(
            [Source("a"), MidwayFailure("b", exc), Source("c")],
            base,
            reader_config=ORDERED,
            writer_config=QUIET,
        )
    assert info.value is exc
    assert published(base) == ["a"]
    assert_no_staging(base)


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "CacheSource.name must not be empty"),
        ("a/b", "CacheSource.name must be a plain path segment"),
        ("/abs", "CacheSource.name must be a plain path segment"),
        (".", "CacheSource.name must be a plain path segment"),
        ("..", "CacheSource.name must be a plain path segment"),
        ("tmp", "CacheSource.name must be a non-reserved plain path segment"),
    ],
    ids=["empty", "slash", "absolute", "dot", "dotdot", "tmp"],
)
def test_invalid_names(runtime, tmp_path: Path, name: str, message: str) -> None:
    base = tmp_path / "base"
    source = Source(name)
    assert write_one(runtime, base, source) == drt.CacheWriteError("source[0]", message)
    assert source.iterations == 0
    # Name errors are found before anything is created, not even the base directory.
    assert tree(base) is None


def test_name_tmp_leaves_existing_staging_root_alone(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    assert write_one(runtime, base, Source("a")) == drt.CacheWriteSuccess("a", base / "a")
    before = snapshot(base)
    assert write_one(runtime, base, Source("tmp")) == drt.CacheWriteError(
        "source[0]", "CacheSource.name must be a non-reserved plain path segment"
    )
    assert snapshot(base) == before


def test_name_validation_order_empty_before_segment(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    results = runtime.write_cache(
        [Source(""), Source("x/y"), Source("ok")], base, writer_config=QUIET
    )
    assert results == [
        drt.CacheWriteError("source[0]", "CacheSource.name must not be empty"),
        drt.CacheWriteError("source[1]", "CacheSource.name must be a plain path segment"),
        drt.CacheWriteSuccess("ok", base / "ok"),
    ]


@pytest.mark.parametrize("name", ["TMP", "Tmp", "é", "tmp2", ".hidden", "a b", "日本"])
def test_unusual_valid_names(runtime, tmp_path: Path, name: str) -> None:
    base = tmp_path / "base"
    assert write_one(runtime, base, Source(name)) == drt.CacheWriteSuccess(name, base / name)
    assert_published_cache(base, name)
    assert_no_staging(base)
    assert [s.data for s in read_back(runtime, base / name)] == [b"payload"]


@pytest.mark.parametrize("name", ["a\x00b", "a\\b", "a/", "é//"])
def test_name_with_nul_or_backslash(runtime, tmp_path: Path, name: str) -> None:
    """SPEC section 2: NUL, backslash and a trailing slash are not plain path segments;
    like the other name errors they are reported under source[i] before anything is
    created (the reference fails late with an I/O error for NUL, and its serial writer
    accepts a backslash and a trailing slash)."""
    base = tmp_path / "base"
    result = write_one(runtime, base, Source(name))
    assert result == drt.CacheWriteError(
        "source[0]", "CacheSource.name must be a plain path segment"
    )
    assert tree(base) is None


def test_name_too_long(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    name = "x" * 256
    result = write_one(runtime, base, Source(name))
    assert type(result) is drt.CacheWriteError
    assert result.source_name == name
    assert result.message.startswith("I/O error: File name too long (os error 36)")
    assert_failed_cleanly(base)


def test_name_of_255_bytes_is_fine(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    name = "é" * 127 + "x"  # 255 UTF-8 bytes
    assert len(name.encode()) == 255
    assert write_one(runtime, base, Source(name)) == drt.CacheWriteSuccess(name, base / name)


class _PropertyName:
    def __init__(self) -> None:
        self.reads = 0

    @property
    def name(self) -> str:
        self.reads += 1
        return "prop"

    def __iter__(self) -> Any:
        return iter(ONE_ROW)


class _FailingName:
    @property
    def name(self) -> str:
        raise LookupError("no name today")

    def __iter__(self) -> Any:
        return iter(ONE_ROW)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (Source(5), "Python error: TypeError: 'int' object is not an instance of 'str'"),
        (
            Source("\udcff"),
            "Python error: UnicodeEncodeError: 'utf-8' codec can't encode character '\\udcff' "
            "in position 0: surrogates not allowed",
        ),
        (NoName(), "Python error: AttributeError: 'NoName' object has no attribute 'name'"),
        (_FailingName(), "Python error: LookupError: no name today"),
    ],
    ids=["int", "lone_surrogate", "no_attribute", "property_raises"],
)
def test_unreadable_names(runtime, tmp_path: Path, source: Any, message: str) -> None:
    base = tmp_path / "base"
    assert write_one(runtime, base, source) == drt.CacheWriteError("source[0]", message)
    assert tree(base) is None


def test_non_list_sources_are_one_source(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    result = write_one(runtime, base, (Source("a"), Source("b")))
    assert result == drt.CacheWriteError(
        "source[0]", "Python error: AttributeError: 'tuple' object has no attribute 'name'"
    )
    assert tree(base) is None


def test_name_property_is_read_once(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    source = _PropertyName()
    assert write_one(runtime, base, source) == drt.CacheWriteSuccess("prop", base / "prop")
    assert source.reads == 1


def test_duplicate_names_raise_before_writing(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    sources = [Source("a"), Source("d"), Source("d")]
    with pytest.raises(ValueError) as info:
        runtime.write_cache(sources, base, writer_config=QUIET)
    assert type(info.value) is ValueError
    assert str(info.value) == f"duplicate generated cache path: {base / 'd'}"
    assert tree(base) is None
    assert [s.iterations for s in sources] == [0, 0, 0]


def test_duplicate_names_raise_in_from_cache_sources(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    with pytest.raises(ValueError, match=r"^duplicate generated cache path: "):
        runtime.from_cache_sources(
            [Source("d"), Source("d")], base, reader_config=ORDERED, writer_config=QUIET
        )
    assert tree(base) is None


def test_duplicate_check_keeps_relative_base(
    runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        runtime.write_cache([Source("d"), Source("d")], "rel/base", writer_config=QUIET)
    assert str(info.value) == "duplicate generated cache path: rel/base/d"
    assert tree(tmp_path / "rel") is None


def test_names_differing_in_case_are_distinct(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    results = runtime.write_cache([Source("d"), Source("D")], base, writer_config=QUIET)
    assert results == [
        drt.CacheWriteSuccess("d", base / "d"),
        drt.CacheWriteSuccess("D", base / "D"),
    ]
    assert published(base) == ["D", "d"]


def test_relative_base_stays_relative(
    runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    [result] = runtime.write_cache(Source("a"), "rel", writer_config=QUIET)
    assert result == drt.CacheWriteSuccess("a", Path("rel") / "a")
    assert not result.path.is_absolute()


# --------------------------------------------------------------- destination / base


def test_destination_already_exists(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    assert write_one(runtime, base, Source("full")) == drt.CacheWriteSuccess("full", base / "full")
    (base / "dir_without_manifest").mkdir()
    (base / "dir_without_manifest" / "junk").write_bytes(b"junk")
    (base / "empty_dir").mkdir()
    (base / "file").write_bytes(b"file")
    (tmp_path / "elsewhere").mkdir()
    (base / "link_to_dir").symlink_to(tmp_path / "elsewhere")
    before = snapshot(base)
    names = ["full", "dir_without_manifest", "empty_dir", "file", "link_to_dir"]
    sources = [Source(n) for n in names]
    results = runtime.write_cache(sources, base, writer_config=QUIET)
    assert results == [
        drt.CacheWriteError(n, f"cache path already exists: {base / n}") for n in names
    ]
    assert [s.iterations for s in sources] == [0] * len(names)
    assert snapshot(base) == before
    assert_no_staging(base)


def test_destination_is_a_dangling_symlink(runtime, tmp_path: Path) -> None:
    # The reference fails with 'I/O error: Not a directory (os error 20)'; SPEC section 3
    # (renameat2 NOREPLACE) refuses any existing entry. Either way: an error, nothing
    # published, the link untouched, no staging left.
    base = tmp_path / "base"
    base.mkdir()
    (base / "link").symlink_to(tmp_path / "nowhere")
    result = write_one(runtime, base, Source("link"))
    assert type(result) is drt.CacheWriteError
    assert result.source_name == "link"
    assert (
        result.message == f"cache path already exists: {base / 'link'}"
        or result.message.startswith("I/O error: Not a directory (os error 20)")
    )
    assert os.readlink(base / "link") == str(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()
    assert published(base) == ["link"]
    assert_no_staging(base)


def test_base_is_a_regular_file(runtime, tmp_path: Path) -> None:
    base = tmp_path / "file"
    base.write_bytes(b"not a directory")
    result = write_one(runtime, base, Source("x"))
    assert type(result) is drt.CacheWriteError
    assert result.source_name == "x"
    assert result.message.startswith("I/O error: Not a directory (os error 20)")
    assert base.read_bytes() == b"not a directory"


def test_base_directory_is_created_with_parents(runtime, tmp_path: Path) -> None:
    base = tmp_path / "a" / "b" / "c"
    assert write_one(runtime, base, Source("x")) == drt.CacheWriteSuccess("x", base / "x")
    assert_published_cache(base, "x")


def test_empty_source_list(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    assert runtime.write_cache([], base, writer_config=QUIET) == []
    assert tree(base) is None


def test_from_cache_sources_empty_list(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    result = runtime.from_cache_sources([], base, reader_config=ORDERED, writer_config=QUIET)
    assert result == drt.CacheSourcesDatasetError([], "no cache sources were provided")
    assert type(result) is drt.CacheSourcesDatasetError
    assert tree(base) is None


def test_from_cache_sources_only_empty_source(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    result = runtime.from_cache_sources(
        Source("b1", []), base, reader_config=ORDERED, writer_config=QUIET
    )
    assert result == drt.CacheSourcesDatasetError(
        [drt.CacheWriteError("b1", "cache source yielded no samples")],
        "no caches were written: b1: cache source yielded no samples",
    )
    assert_failed_cleanly(base)


def test_from_cache_sources_joins_every_error(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    result = runtime.from_cache_sources(
        [Source("b1", []), Source(""), Source("b3", [(1.5, {"k": 1})])],
        base,
        reader_config=ORDERED,
        writer_config=QUIET,
    )
    errors = [
        drt.CacheWriteError("b1", "cache source yielded no samples"),
        drt.CacheWriteError("source[1]", "CacheSource.name must not be empty"),
        drt.CacheWriteError("b3", "data must be bytes-like"),
    ]
    assert result == drt.CacheSourcesDatasetError(
        errors,
        "no caches were written: " + "; ".join(f"{e.source_name}: {e.message}" for e in errors),
    )
    assert_failed_cleanly(base)


def test_from_cache_sources_partial_success(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    result = runtime.from_cache_sources(
        [Source("a"), Source("b", [])], base, reader_config=ORDERED, writer_config=QUIET
    )
    assert type(result) is drt.CacheSourcesDatasetSuccess
    assert result.results == [
        drt.CacheWriteSuccess("a", base / "a"),
        drt.CacheWriteError("b", "cache source yielded no samples"),
    ]
    assert result.dataset.cache_paths == [base / "a"]
    assert [s.data for s in result.dataset] == [b"payload"]
    assert_no_staging(base)


# --------------------------------------------------------------------- config errors


def _bypass(**changes: Any) -> WriterConfig:
    fields = {name: getattr(QUIET, name) for name in WriterConfig.model_fields}
    fields.update(changes)
    return WriterConfig.model_construct(**fields)


CONFIG_ERRORS = {
    "ratio_with_none": (
        WriterConfig(
            show_progress=False, shard_compression=ShardCompression(algo="none", ratio=2.0)
        ),
        ValueError,
        "shard_compression.ratio must be 1.0 when algo is 'none'",
    ),
    "ratio_inf": (
        WriterConfig(
            show_progress=False, shard_compression=ShardCompression(algo="lz4", ratio=math.inf)
        ),
        ValueError,
        "shard_compression.ratio must be positive and finite",
    ),
    "ratio_zero_bypassed": (
        _bypass(shard_compression=ShardCompression.model_construct(algo="lz4", ratio=0.0)),
        ValueError,
        "shard_compression.ratio must be positive and finite",
    ),
    "ratio_negative_bypassed": (
        _bypass(shard_compression=ShardCompression.model_construct(algo="lz4", ratio=-1.0)),
        ValueError,
        "shard_compression.ratio must be positive and finite",
    ),
    "ratio_nan_bypassed": (
        _bypass(shard_compression=ShardCompression.model_construct(algo="lz4", ratio=math.nan)),
        ValueError,
        "shard_compression.ratio must be positive and finite",
    ),
    "algo_zstd_bypassed": (
        _bypass(shard_compression=ShardCompression.model_construct(algo="zstd", ratio=1.0)),
        ValueError,
        "unsupported shard compression algorithm 'zstd'",
    ),
    "prefetch_zero_bypassed": (
        _bypass(prefetch_size=0),
        ValueError,
        "prefetch_size must be greater than zero",
    ),
    "max_shard_bytes_zero_bypassed": (
        _bypass(max_shard_bytes=0),
        ValueError,
        "max_shard_bytes must be greater than zero",
    ),
    "prefetch_2**64": (
        WriterConfig(show_progress=False, prefetch_size=2**64),
        RuntimeError,
        "Python error: OverflowError: int too big to convert",
    ),
    "max_shard_bytes_2**64": (
        WriterConfig(show_progress=False, max_shard_bytes=2**64),
        RuntimeError,
        "Python error: OverflowError: int too big to convert",
    ),
    "config_none": (
        None,
        RuntimeError,
        "Python error: AttributeError: 'NoneType' object has no attribute 'max_shard_bytes'",
    ),
    "config_dict": (
        {},
        RuntimeError,
        "Python error: AttributeError: 'dict' object has no attribute 'max_shard_bytes'",
    ),
}


@pytest.mark.parametrize(
    ("config", "error", "message"), CONFIG_ERRORS.values(), ids=CONFIG_ERRORS.keys()
)
@pytest.mark.parametrize("entry", ["write_cache", "from_cache_sources"])
def test_config_errors_raise_before_touching_disk(
    runtime, tmp_path: Path, config: Any, error: type[Exception], message: str, entry: str
) -> None:
    base = tmp_path / "base"
    source = Source("a")
    with pytest.raises(Exception) as info:
        if entry == "write_cache":
            runtime.write_cache([source], base, writer_config=config)
        else:
            runtime.from_cache_sources([source], base, reader_config=ORDERED, writer_config=config)
    assert type(info.value) is error
    assert str(info.value) == message
    assert tree(base) is None
    assert source.iterations == 0


def test_config_error_wins_over_an_existing_cache(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    assert write_one(runtime, base, Source("a")) == drt.CacheWriteSuccess("a", base / "a")
    before = snapshot(base)
    bad = _bypass(prefetch_size=0)
    with pytest.raises(ValueError, match=r"^prefetch_size must be greater than zero$"):
        runtime.from_cache_sources(
            NeverIterate("a"), base, reader_config=ORDERED, writer_config=bad
        )
    assert snapshot(base) == before


def test_default_writer_config_is_the_shared_object() -> None:
    import inspect

    for method in (drt.DatasetRuntime.write_cache, drt.DatasetRuntime.from_cache_sources):
        assert (
            inspect.signature(method).parameters["writer_config"].default is DEFAULT_WRITER_CONFIG
        )


# ---------------------------------------------------------------------- reuse (4.2)


def test_reuse_does_not_iterate_the_source(runtime, fixture_copy) -> None:
    cache = fixture_copy("plain_one_shard")
    base = cache.parent
    before = snapshot(base)
    for config in (QUIET, VALIDATING):
        result = runtime.from_cache_sources(
            NeverIterate("plain_one_shard"), base, reader_config=ORDERED, writer_config=config
        )
        assert type(result) is drt.CacheSourcesDatasetSuccess
        assert result.results == [
            drt.CacheWriteSuccess("plain_one_shard", base / "plain_one_shard")
        ]
        assert len(result.dataset) == 120
        assert next(iter(result.dataset)).cache_id == 4233350989699285984
    assert snapshot(base) == before


def test_reuse_of_a_renamed_cache_keeps_its_manifest_id(runtime, fixture_copy) -> None:
    cache = fixture_copy("unicode_é_name")
    renamed = cache.rename(cache.parent / "renamed")
    result = runtime.from_cache_sources(
        NeverIterate("renamed"), renamed.parent, reader_config=ORDERED
    )
    assert type(result) is drt.CacheSourcesDatasetSuccess
    assert {s.cache_id for s in result.dataset} == {716452998420398136}


def test_reuse_validate_cache_accepts_reference_floats(runtime, fixture_copy) -> None:
    # Policy 1: the reference's validate_cache rejects 271/3.0 in this fixture.
    cache = fixture_copy("plain_many_shards")
    result = runtime.from_cache_sources(
        NeverIterate("plain_many_shards"),
        cache.parent,
        reader_config=ORDERED,
        writer_config=VALIDATING,
    )
    assert type(result) is drt.CacheSourcesDatasetSuccess
    assert len(list(result.dataset)) == 300


def test_reuse_with_validate_cache_detects_a_flipped_shard_byte(runtime, fixture_copy) -> None:
    cache = fixture_copy("plain_one_shard")
    base = cache.parent
    shard = cache / "shards" / "000000.bin"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    before = snapshot(base)

    # Without validation the flipped byte goes unnoticed (reference 4.2 / 4.5).
    plain = runtime.from_cache_sources(NeverIterate("plain_one_shard"), base, reader_config=ORDERED)
    assert type(plain) is drt.CacheSourcesDatasetSuccess

    message = f"checksum mismatch for {cache / 'shards' / '000000.bin'}"
    result = runtime.from_cache_sources(
        NeverIterate("plain_one_shard"), base, reader_config=ORDERED, writer_config=VALIDATING
    )
    assert result == drt.CacheSourcesDatasetError(
        [drt.CacheWriteError("plain_one_shard", message)],
        f"no caches were written: plain_one_shard: {message}",
    )
    assert snapshot(base) == before


@pytest.mark.parametrize(
    ("target", "corrupt"),
    [
        ("index.bin", lambda p: p.write_bytes(p.read_bytes()[:-24] + bytes(24))),
        ("metadata.arrow", lambda p: p.write_bytes(p.read_bytes()[:-1] + b"\x01")),
    ],
    ids=["index", "metadata"],
)
def test_reuse_with_validate_cache_checks_every_file(
    runtime, fixture_copy, target: str, corrupt: Any
) -> None:
    cache = fixture_copy("plain_one_shard")
    corrupt(cache / target)
    result = runtime.from_cache_sources(
        NeverIterate("plain_one_shard"),
        cache.parent,
        reader_config=ORDERED,
        writer_config=VALIDATING,
    )
    message = f"checksum mismatch for {cache / target}"
    assert result == drt.CacheSourcesDatasetError(
        [drt.CacheWriteError("plain_one_shard", message)],
        f"no caches were written: plain_one_shard: {message}",
    )


def _make_file(path: Path) -> None:
    path.write_bytes(b"not a cache")


def _make_empty_dir(path: Path) -> None:
    path.mkdir()


def _make_partial(path: Path) -> None:
    path.mkdir()
    (path / "shards").mkdir()
    (path / "shards" / "000000.bin").write_bytes(b"")
    (path / "index.bin").write_bytes(b"")


@pytest.mark.parametrize(
    "make", [_make_file, _make_empty_dir, _make_partial], ids=["file", "empty_dir", "partial"]
)
@pytest.mark.parametrize("config", [QUIET, VALIDATING], ids=["plain", "validate_cache"])
def test_reuse_of_a_path_without_manifest_is_a_result(
    runtime, tmp_path: Path, make: Any, config: Any
) -> None:
    # Policy 5: the reference reports success, then cached_dataset raises.
    base = tmp_path / "base"
    base.mkdir()
    make(base / "s")
    before = snapshot(base)
    result = runtime.from_cache_sources(
        NeverIterate("s"), base, reader_config=ORDERED, writer_config=config
    )
    message = f"missing manifest: {base / 's' / 'manifest.json'}"
    assert result == drt.CacheSourcesDatasetError(
        [drt.CacheWriteError("s", message)], f"no caches were written: s: {message}"
    )
    assert type(result) is drt.CacheSourcesDatasetError
    assert snapshot(base) == before


@pytest.mark.parametrize("config", [QUIET, VALIDATING], ids=["plain", "validate_cache"])
def test_reuse_of_a_corrupt_manifest_is_a_result(runtime, tmp_path: Path, config: Any) -> None:
    base = tmp_path / "base"
    (base / "s").mkdir(parents=True)
    (base / "s" / "manifest.json").write_text("{1: 2}")
    before = snapshot(base)
    result = runtime.from_cache_sources(
        NeverIterate("s"), base, reader_config=ORDERED, writer_config=config
    )
    assert type(result) is drt.CacheSourcesDatasetError
    [error] = result.results
    assert type(error) is drt.CacheWriteError
    assert error.source_name == "s"
    assert error.message.startswith("JSON error: ")
    assert result.message == f"no caches were written: s: {error.message}"
    assert snapshot(base) == before


def test_reuse_mixed_with_writes_and_failures(runtime, fixture_copy) -> None:
    cache = fixture_copy("plain_one_shard")
    base = cache.parent
    (base / "broken").mkdir()
    fresh = Source("fresh", [(b"new", {"flag": True, "label": 1, "name": "n", "score": 0.5})])
    result = runtime.from_cache_sources(
        [NeverIterate("plain_one_shard"), NeverIterate("broken"), fresh],
        base,
        reader_config=ORDERED,
        writer_config=QUIET,
    )
    assert type(result) is drt.CacheSourcesDatasetSuccess
    assert result.results == [
        drt.CacheWriteSuccess("plain_one_shard", base / "plain_one_shard"),
        drt.CacheWriteError("broken", f"missing manifest: {base / 'broken' / 'manifest.json'}"),
        drt.CacheWriteSuccess("fresh", base / "fresh"),
    ]
    assert fresh.iterations == 1
    assert result.dataset.cache_paths == [base / "plain_one_shard", base / "fresh"]
    assert len(result.dataset) == 121
    assert list((base / "broken").iterdir()) == []
    assert_no_staging(base)


def test_second_from_cache_sources_reuses_what_the_first_wrote(runtime, tmp_path: Path) -> None:
    base = tmp_path / "base"
    first = runtime.from_cache_sources(
        Source("a"), base, reader_config=ORDERED, writer_config=QUIET
    )
    assert type(first) is drt.CacheSourcesDatasetSuccess
    before = snapshot(base)
    second = runtime.from_cache_sources(
        NeverIterate("a"), base, reader_config=ORDERED, writer_config=VALIDATING
    )
    assert type(second) is drt.CacheSourcesDatasetSuccess
    assert second.results == [drt.CacheWriteSuccess("a", base / "a")]
    assert [s.data for s in second.dataset] == [b"payload"]
    assert snapshot(base) == before


def test_write_cache_never_reuses(runtime, fixture_copy) -> None:
    cache = fixture_copy("plain_one_shard")
    before = snapshot(cache)
    source = Source("plain_one_shard")
    assert write_one(runtime, cache.parent, source) == drt.CacheWriteError(
        "plain_one_shard", f"cache path already exists: {cache}"
    )
    assert source.iterations == 0
    assert snapshot(cache) == before


def test_file_size_limit_is_an_io_error_in_words(tmp_path: Path) -> None:
    """A shard write refused with EFBIG (``ulimit -f``) reads as 0.4.8's "File too large
    (os error 27)" and names the file; nothing is published."""
    import resource
    import subprocess
    import sys

    script = """
import sys
import dataset_rt as drt

class Big:
    name = "big"
    def __iter__(self):
        for i in range(40):
            yield (bytes(100_000), {"i": i})

runtime = drt.DatasetRuntime(num_workers=1)
config = drt.WriterConfig(show_progress=False)
[result] = runtime.write_cache(Big(), sys.argv[1], writer_config=config)
print(repr(result))
"""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    base = tmp_path / "base"
    done = subprocess.run(
        [sys.executable, "-c", script, str(base)],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = done.stdout.strip()
    assert out.startswith(
        "CacheWriteError(source_name='big', message='I/O error: File too large (os error 27): "
    ), out
    assert "shards/000000.bin" in out
    assert_failed_cleanly(base)
