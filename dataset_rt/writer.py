"""Writing sources into caches.

Python's part is to pull samples from the source on the calling thread, check their
Python types, and hand them to the native writer in columnar batches (payloads
concatenated with offsets, one typed array per metadata field). The native writer owns
the bytes: record encoding, compression, hashing, shard rotation, the index, the manifest,
the metadata columns as ``metadata.arrow``, fsync and the atomic publication.

Contract (see the compatibility page of the docs for the deliberate fixes):
* one result per source, in source order; a per-source failure is a
  :class:`CacheWriteError` value and the other sources still run;
* ``KeyboardInterrupt`` and ``SystemExit`` propagate unchanged after the staging
  directory is removed; sources finished earlier stay published;
* a failed write never publishes anything.
"""

from __future__ import annotations

import ctypes
import gc
import math
import operator
import os
import sys
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any

from dataset_rt import _native
from dataset_rt._native import KIND_NAMES, Kind
from dataset_rt.config import WriterConfig
from dataset_rt.records import (
    CacheInput,
    CacheSource,
    CacheWriteError,
    CacheWriteResult,
    CacheWriteSuccess,
    Err,
    Ok,
    Result,
)

# The names 0.4.8's ``dataset_rt.writer`` module path offers its users (the rest of this
# module is this project's engine).
__all__ = [
    "CacheInput",
    "CacheSource",
    "CacheWriteError",
    "CacheWriteResult",
    "CacheWriteSuccess",
    "Err",
    "Ok",
    "Result",
    "validate_source_name",
]

_PLAIN_TYPES: dict[int, type] = {
    Kind.BOOL: bool,
    Kind.INT: int,
    Kind.FLOAT: float,
    Kind.STRING: str,
}
RESERVED_KEYS = ("cache_id", "sample_id", "weight")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Samples handed to the native writer per call, at most; batches also stop growing at
# about BATCH_BYTES_MAX payload bytes (sized from the payloads seen so far).
BATCH_SAMPLES_MAX = 4096
BATCH_BYTES_MAX = 8 << 20
# Batches whose payloads average at least this many bytes go to the native writer by
# pointer, one per payload, written straight from the caller's buffers (no join).
LARGE_PAYLOAD_BYTES = 64 << 10


class SourceFailure(Exception):
    """A per-source failure whose message becomes a CacheWriteError."""


def python_error(exc: BaseException) -> str:
    """The reference's text for an exception raised by user code:
    ``Python error: <qualified name>: <str(exc)>``, the class's ``__qualname__``
    (``Outer.Inner``, ``f.<locals>.E``; no module). An exception whose ``__str__`` raises
    (or returns a non-string) reads ``<exception str() failed>`` there, as in 0.4.8;
    this never raises ``Exception`` itself."""
    return f"Python error: {type(exc).__qualname__}: {_exception_str(exc)}"


def _exception_str(exc: BaseException) -> str:
    """``str(exc)``, or pyo3's ``<exception str() failed>`` when that raises."""
    try:
        return str(exc)
    except Exception:
        return "<exception str() failed>"


def not_an_instance(value: object, expected: str) -> str:
    """pyo3's text for a value of the wrong type (the reference's, for a source name that
    is not a ``str``): ``'int' object is not an instance of 'str'``, but
    ``'None' is not an instance of 'str'`` for None; type names are ``__qualname__``."""
    if value is None:
        return f"'None' is not an instance of '{expected}'"
    return f"'{type(value).__qualname__}' object is not an instance of '{expected}'"


def validate_source_name(name: str) -> Result[str, str]:
    """``Ok(name)`` if ``name`` can be a source's cache directory name, else ``Err(reason)``:
    dataset-rt 0.4.8's public check (its ``dataset_rt.writer.validate_source_name``), with
    its rules and messages. Touches no file.

    Rules, in order: not empty and not ``.``, ``..`` or ``tmp`` in any case
    (``"CacheSource.name must be a non-reserved plain path segment"``); no ``/`` or NUL
    (``"CacheSource.name must be a plain path segment"``); encodable as UTF-8
    (``"CacheSource.name must be valid UTF-8"``); at most 255 bytes
    (``"CacheSource.name exceeds the supported filesystem component limit"``).
    dataset_rt's writers apply these and also refuse a backslash (see the
    compatibility page).
    """
    if not name or name.casefold() in (".", "..", "tmp"):
        return Err("CacheSource.name must be a non-reserved plain path segment")
    if "/" in name or "\x00" in name:
        return Err("CacheSource.name must be a plain path segment")
    try:
        encoded = name.encode()
    except UnicodeEncodeError:
        return Err("CacheSource.name must be valid UTF-8")
    if len(encoded) > 255:
        return Err("CacheSource.name exceeds the supported filesystem component limit")
    return Ok(name)


def _byte_view(data: object) -> Any:
    """A flat byte view of any buffer-protocol object (len() is its size in bytes).

    Only the buffer protocol makes a payload: ints, lists and str are rejected (SPEC
    compatibility policy 3)."""
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise SourceFailure("data must be bytes-like") from None
    if view.ndim == 1 and view.format == "B" and view.c_contiguous:
        return view
    try:
        return view.cast("B")
    except TypeError:  # not C-contiguous: copy it
        return view.tobytes()


def _all_exactly(cls: type, items: Sequence[Any]) -> bool:
    """Whether every item's type is exactly ``cls`` (subclasses are not): two C-level
    passes, no per-item objects, cheaper than collecting the types in a set (no
    hashing). ``list.count`` compares by identity first; only a metaclass whose
    ``__eq__`` claims to equal ``cls`` could pass (as one could with ``__hash__`` too
    against a set)."""
    return list(map(type, items)).count(cls) == len(items)


def _joined_strings(values: list[Any]) -> tuple[bytes, Any] | None:
    """UTF-8 bytes of ``values`` back to back and their ``len + 1`` uint64 offsets, with
    no per-value Python work: the values are joined with NUL separators, encoded once, and
    the offsets are the separators' positions (found with numpy). None when a value is not
    a ``str``, holds a NUL itself or cannot be encoded (the caller's slow path reports it).
    """
    import numpy as np

    count = len(values)
    try:
        data = "\0".join(values).encode("utf-8")
    except (TypeError, UnicodeEncodeError):
        return None
    separators = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0)
    if len(separators) != count - 1:
        return None
    offsets = np.empty(count + 1, dtype=np.uint64)
    offsets[0] = 0
    # Value i ends at its separator, less the i separators before it.
    offsets[1:count] = separators - np.arange(count - 1)
    offsets[count] = len(data) - (count - 1)
    if count > 1:
        data = data.replace(b"\0", b"")
    return data, offsets


def _constant_strings(values: list[Any]) -> tuple[bytes, Any] | None:
    """``_joined_strings`` for a column whose values all hold one string (a split name, a
    source label): the value encoded once and repeated, with evenly spaced offsets.

    The check compares contents, never calls ``__eq__`` (a ``str`` subclass may claim to
    equal anything): the values joined with NUL separators (C-level; a non-``str`` value
    raises TypeError) must equal the first value repeated the same way. When the first
    value holds no NUL, the joined text then has exactly the separators' NULs, so it
    splits back into ``count`` copies of the first value. None when the values differ,
    the first value holds a NUL or cannot be encoded (the general path handles, or
    reports, those)."""
    import numpy as np

    count = len(values)
    first = values[0]
    if type(first) is not str or "\0" in first:
        return None
    try:
        joined = "\0".join(values)
    except TypeError:
        return None
    if (
        len(joined) != count * (len(first) + 1) - 1
        or joined != (first + "\0") * (count - 1) + first
    ):
        return None
    try:
        encoded = first.encode("utf-8")
    except UnicodeEncodeError:
        return None
    offsets = np.arange(count + 1, dtype=np.uint64) * np.uint64(len(encoded))
    return encoded * count, offsets


def _uniform_length(lengths: list[int]) -> int | None:
    """The common value of ``lengths`` (not empty) when all are equal (fixed-size
    records), else None: one C-level pass, no per-item objects."""
    first = lengths[0]
    return first if lengths.count(first) == len(lengths) else None


def _is_numpy_bool(value: object) -> bool:
    cls = type(value)
    return cls.__module__ == "numpy" and cls.__name__ in ("bool_", "bool")


# 0.4.8's error for a value of another type, and for a string that is not UTF-8 encodable.
VALUE_TYPES_MESSAGE = "metadata values must be bool, int, float, or str"


# CPython's ``PyFloat_AsDouble`` (what 0.4.8 converts a float value with): unlike
# ``float()`` it never parses text, also for str and bytes subclasses whose ``float()``
# would (np.str_, np.bytes_), and it sees the type's C slots, which Python-level lookups
# do not (np.str_ has ``__float__`` by its MRO but no ``nb_float``). A PyDLL function
# raises the Python error it leaves set. Only str and bytes subclasses take this path.
_PY_FLOAT_AS_DOUBLE = ctypes.pythonapi.PyFloat_AsDouble
_PY_FLOAT_AS_DOUBLE.argtypes = [ctypes.py_object]
_PY_FLOAT_AS_DOUBLE.restype = ctypes.c_double


# str and bytes subclasses that have neither C slot (PyFloat_AsDouble refuses them without
# running any code: np.str_, np.bytes_), so that their values skip the call.
_NO_FLOAT_SLOTS: set[type] = set()


def _as_double(value: object) -> float | None:
    """``value`` as 0.4.8 converts a float (``PyFloat_AsDouble``: ``__float__``, else
    ``__index__``), or None when that fails (any ``Exception``; ``KeyboardInterrupt`` and
    ``SystemExit`` propagate). ``value`` is not a ``float``."""
    cls = type(value)
    if cls in _NO_FLOAT_SLOTS or not (hasattr(cls, "__float__") or hasattr(cls, "__index__")):
        return None
    try:
        if isinstance(value, (str, bytes, bytearray)):
            return float(_PY_FLOAT_AS_DOUBLE(value))
        return float(value)  # the same as PyFloat_AsDouble for a type with these slots
    except TypeError as exc:
        # CPython's text for a type without either slot (then nothing else ran)
        if isinstance(value, (str, bytes, bytearray)) and str(exc).startswith(
            "must be real number, not "
        ):
            _NO_FLOAT_SLOTS.add(cls)
        return None
    except Exception:
        return None


def metadata_value(value: object) -> tuple[Kind, Any]:
    """One metadata value's kind and the plain value stored (``bool``, ``int``, ``float``
    or ``str``), as dataset-rt 0.4.8 classifies it; raises
    ``SourceFailure(VALUE_TYPES_MESSAGE)`` for a value of no kind.

    0.4.8 tries, in order: bool (``bool`` and numpy bools); an int64 through
    ``__index__`` (ints and their subclasses by the value they hold, numpy integers,
    IntEnum, 0-d integer arrays, any object with ``__index__``, also a ``str`` or
    ``float`` subclass that has one); a float through ``__float__`` or else
    ``__index__`` (floats, numpy floats, Decimal, Fraction, 0-d arrays, np.complex64
    with numpy's ComplexWarning, any object with ``__float__``); a ``str`` (subclasses
    by the text they hold). An exception raised by ``__index__`` or ``__float__`` only
    means "not this kind".

    An integer value (``__index__``) outside int64 is returned as ``(Kind.INT, value)``
    for the caller to reject (SPEC compatibility policy 3; 0.4.8 stores its float) when
    0.4.8 could store it as a float, and is of no kind when it could not (``10**400``).
    Non-finite floats are returned as they are (the caller rejects them, policy 2)."""
    cls = type(value)
    if cls is int:
        if INT64_MIN <= value <= INT64_MAX:  # type: ignore[operator]
            return Kind.INT, value
    elif cls is str:
        return Kind.STRING, value
    elif cls is float:
        return Kind.FLOAT, value
    elif cls is bool or _is_numpy_bool(value):
        return Kind.BOOL, bool(value)
    number: int | None = None
    if hasattr(cls, "__index__"):
        try:
            number = operator.index(value)  # type: ignore[arg-type]
        except Exception:
            number = None
        if number is not None and INT64_MIN <= number <= INT64_MAX:
            return Kind.INT, number
    real = float.__float__(value) if isinstance(value, float) else _as_double(value)  # type: ignore[arg-type]
    if real is not None:
        return (Kind.FLOAT, real) if number is None else (Kind.INT, number)
    if isinstance(value, str):
        return Kind.STRING, str.__str__(value)
    raise SourceFailure(VALUE_TYPES_MESSAGE)


def value_kind(value: object) -> Kind:
    """The kind of one metadata value (see :func:`metadata_value`)."""
    return metadata_value(value)[0]


def _fits_double(number: int) -> bool:
    """Whether 0.4.8 could store an int outside int64 as a float (``10**400`` it cannot:
    it rejects the value with VALUE_TYPES_MESSAGE)."""
    try:
        float(number)
    except OverflowError:
        return False
    return True


def _int_range_message(key: str, number: int) -> str:
    """The error for an int outside int64 in field ``key`` (SPEC compatibility policy 3),
    or 0.4.8's own value error when it would not store the int as a float either."""
    if _fits_double(number):
        return f"metadata field '{key}' is outside the int64 range"
    return VALUE_TYPES_MESSAGE


def _entry_failure(row: dict[Any, Any]) -> SourceFailure | None:
    """The first error 0.4.8 finds in a row before comparing it with the schema, if any:
    entry by entry in dict order, the key must be a ``str`` (``metadata keys must be
    strings``) encodable as UTF-8 (``Python error: UnicodeEncodeError: ...``) and the value
    of a kind, a string value encodable too (VALUE_TYPES_MESSAGE).

    Only called for a row that failed (the error path): its message wins over the
    schema's and this project's checks (missing key, kind drift, reserved key, int64
    range, finite float), as in 0.4.8."""
    for key, value in row.items():
        if not isinstance(key, str):
            return SourceFailure("metadata keys must be strings")
        if not key.isascii():
            try:
                key.encode("utf-8")
            except UnicodeEncodeError as exc:
                return SourceFailure(python_error(exc))
        try:
            kind, plain = metadata_value(value)
        except SourceFailure as failure:
            return failure
        if kind == Kind.STRING and not plain.isascii():
            try:
                plain.encode("utf-8")
            except UnicodeEncodeError:
                return SourceFailure(VALUE_TYPES_MESSAGE)
    return None


@dataclass(frozen=True)
class _Plan:
    """A source whose name passed validation."""

    position: int
    source: Any
    name: str
    fingerprint: str | None = None
    #: Rebuild: publish by atomically exchanging with the existing (stale) cache.
    replace: bool = False


def validate_writer_config(config: WriterConfig) -> tuple[int, int, _native.Compression, float]:
    """Re-check a (possibly duck-typed) config as the native layer of the reference does.

    Reading the config fails like the reference's extraction (``RuntimeError("Python
    error: ...")``, e.g. for ``writer_config=None`` or sizes of 2**64 and more); invalid
    values raise ValueError. Either way nothing is created on disk.
    """
    try:
        max_shard_bytes = _u64(config.max_shard_bytes)
        prefetch_size = _u64(config.prefetch_size)
        compression = config.shard_compression
        algo = compression.algo
        if not isinstance(algo, str):
            raise TypeError(not_an_instance(algo, "str"))
        ratio = _extract_f64(compression.ratio)
        extract_bool(config.show_progress)
    except Exception as exc:
        raise RuntimeError(python_error(exc)) from exc
    if prefetch_size <= 0:
        raise ValueError("prefetch_size must be greater than zero")
    if max_shard_bytes <= 0:
        raise ValueError("max_shard_bytes must be greater than zero")
    if algo not in ("none", "lz4"):
        raise ValueError(f"unsupported shard compression algorithm '{algo}'")
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError("shard_compression.ratio must be positive and finite")
    if algo == "none" and ratio != 1.0:
        raise ValueError("shard_compression.ratio must be 1.0 when algo is 'none'")
    compression_code = _native.Compression.LZ4 if algo == "lz4" else _native.Compression.NONE
    return prefetch_size, max_shard_bytes, compression_code, ratio


def _extract_f64(value: Any) -> float:
    """A float as pyo3 extracts one (``PyFloat_AsDouble``): ``__float__`` or ``__index__``,
    never text (``"2"`` raises ``TypeError: must be real number, not str``)."""
    if type(value) is float:
        return value
    return float(_PY_FLOAT_AS_DOUBLE(value))


def extract_bool(value: Any) -> bool:
    """A bool as pyo3 extracts one: ``bool`` or a numpy bool, else ``TypeError`` with
    pyo3's text (``'str' object is not an instance of 'bool'``), never truthiness."""
    if isinstance(value, bool) or _is_numpy_bool(value):
        return bool(value)
    raise TypeError(not_an_instance(value, "bool"))


def _u64(value: Any) -> int:
    """An unsigned 64-bit count, converted like pyo3 does (OverflowError when too big)."""
    number = operator.index(value)
    if number < 0:
        raise OverflowError("can't convert negative int to unsigned")
    if number >= 2**64:
        raise OverflowError("int too big to convert")
    return number


def _plan_sources(
    sources: list[Any], base: Path | str, parallel: bool
) -> tuple[list[_Plan], dict[int, CacheWriteResult]]:
    """Read every name once and validate it.

    Serial mode raises for duplicate names before anything is written. Parallel mode,
    like the reference's, compares names case- and Unicode-insensitively (casefold + NFC,
    also for the reserved ``tmp``) and returns a duplicate error for every source.
    """
    plans: list[_Plan] = []
    errors: dict[int, CacheWriteResult] = {}
    seen: set[str] = set()
    for position, source in enumerate(sources):
        label = f"source[{position}]"
        try:
            name = source.name
            if not isinstance(name, str):
                raise TypeError(not_an_instance(name, "str"))
            name.encode("utf-8")
            # Optional (this project's extension): read once, like the name.
            fingerprint = getattr(source, "fingerprint", None)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            errors[position] = CacheWriteError(label, python_error(exc))
            continue
        if fingerprint is not None and not isinstance(fingerprint, str):
            errors[position] = CacheWriteError(label, "CacheSource.fingerprint must be a string")
            continue
        try:
            if fingerprint is not None:
                fingerprint.encode("utf-8")
        except UnicodeEncodeError as exc:
            message = f"CacheSource.fingerprint must be encodable as UTF-8: {exc}"
            errors[position] = CacheWriteError(label, message)
            continue
        key = _fold(name) if parallel else name
        try:
            if parallel:
                # 0.4.8's parallel writer checks names first with its public rules (and
                # their messages: "" is a reserved segment, 256 bytes are too long).
                checked = validate_source_name(name)
                if isinstance(checked, Err):
                    raise ValueError(checked.error)
            # The library's rules and messages; in parallel mode the reserved name is
            # also refused case- and Unicode-insensitively, as the reference does.
            _native.source_name_check(name)
            if key != name:
                _native.source_name_check(key)
        except ValueError as exc:
            errors[position] = CacheWriteError(label, str(exc))
        else:
            if key in seen and not parallel:
                path = base / name if isinstance(base, Path) else f"{base.rstrip('/')}/{name}"
                raise ValueError(f"duplicate generated cache path: {path}")
            seen.add(key)
            plans.append(_Plan(position, source, name, fingerprint))
    if parallel:
        # As the reference: every name is read and checked first, then the first name
        # that collides with an earlier one fails every source, each under its own name.
        folded: set[str] = set()
        for plan in plans:
            if _fold(plan.name) in folded:
                message = f"duplicate generated cache path: {plan.name}"
                for other in plans:
                    errors[other.position] = CacheWriteError(other.name, message)
                return [], errors
            folded.add(_fold(plan.name))
    return plans, errors


def _fold(name: str) -> str:
    return unicodedata.normalize("NFC", name.casefold())


def plan_sources(
    sources: list[Any], base: Path | str, config: WriterConfig
) -> tuple[list[_Plan], dict[int, CacheWriteResult]]:
    """Check the config, read every source name once and validate it (``base``, a
    directory or a URL, is only named in messages).

    Returns the plans to write and the per-position errors found so far. Raises for
    invalid configs and duplicate names before anything is written.
    """
    validate_writer_config(config)
    return _plan_sources(sources, base, parallel=is_parallel(config))


def is_parallel(config: WriterConfig) -> bool:
    """Sources go to spawned processes (``dataset_rt.parallel``; the reference ignores
    ``num_processes`` with the profiler on)."""
    profiling = bool(getattr(getattr(config, "profiler", None), "enabled", False))
    return int(getattr(config, "num_processes", 0) or 0) > 0 and not profiling


def write_planned(
    runtime: _native.Runtime, plans: list[_Plan], base: Path, config: WriterConfig
) -> dict[int, CacheWriteResult]:
    """Write planned sources in order, in this process (the caller sends them to
    ``dataset_rt.parallel`` when :func:`is_parallel`); returns their results by source
    position."""
    options = validate_writer_config(config)
    progress = _Progress.create(bool(config.show_progress), len(plans))
    profiler = getattr(config, "profiler", None)
    if not getattr(profiler, "enabled", False):
        return {
            plan.position: _write_one(runtime, plan, base, options, progress, None)
            for plan in plans
        }
    profiles: list[dict[str, Any]] = []
    started = time.perf_counter_ns()
    results: dict[int, CacheWriteResult] = {}
    try:
        for plan in plans:
            timings = _Timings()
            try:
                results[plan.position] = _write_one(runtime, plan, base, options, progress, timings)
            finally:
                profiles.append({"source_name": plan.name, "stages": timings.report()})
    finally:
        # Sources by name (byte order), as 0.4.8 lists them.
        profiles.sort(key=lambda entry: entry["source_name"].encode("utf-8", "surrogatepass"))
        _write_profile(Path(profiler.path), time.perf_counter_ns() - started, profiles)
    return results


def write_sources(
    runtime: _native.Runtime, sources: Any, path: str | os.PathLike[str], config: WriterConfig
) -> list[CacheWriteResult]:
    """Write each source to ``<path>/<name>`` in this process (``num_processes`` is not
    looked at: a writer process uses this); one result per source, in order."""
    items = sources if isinstance(sources, list) else [sources]
    base = Path(path)
    plans, results = plan_sources(items, base, config)
    results.update(write_planned(runtime, plans, base, config))
    return [results[i] for i in range(len(items))]


class _Timings:
    """Stage timings of one source for WriterProfilerConfig (reference section 5.6)."""

    def __init__(self) -> None:
        self.stages: dict[str, list[int]] = {}

    def add(self, stage: str, started_ns: int, nbytes: int = 0) -> None:
        entry = self.stages.setdefault(stage, [0, 0, 0])
        entry[0] += 1
        entry[1] += time.perf_counter_ns() - started_ns
        entry[2] += nbytes

    def merge_native(self, writer: _native.Writer) -> None:
        """Add the native writer's stage timings (named like the stages of the C API:
        ``Stage.RECORD_ENCODE`` is "record_encode")."""
        try:
            stats = writer.stats()
        except SourceFailure:
            return
        for stat in stats:
            if stat.calls:
                entry = self.stages.setdefault(stat.stage.name.lower(), [0, 0, 0])
                entry[0] += stat.calls
                entry[1] += stat.total_ns
                entry[2] += stat.bytes

    def report(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "calls": calls, "total_ns": total, "bytes": nbytes}
            for name, (calls, total, nbytes) in sorted(self.stages.items())
        ]


def _write_profile(path: Path, elapsed_ns: int, sources: list[dict[str, Any]]) -> None:
    """Write a profile (``sources``: per-source stage entries, in order), atomically: a
    reader sees the old file or the whole new one."""
    import json
    import secrets

    document = {"format_version": 1, "elapsed_ns": elapsed_ns, "sources": sources}
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")
    try:
        partial.write_text(json.dumps(document, separators=(",", ":")), encoding="utf-8")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _write_one(
    runtime: _native.Runtime,
    plan: _Plan,
    base: Path,
    options: tuple[int, int, _native.Compression, float],
    progress: _Progress | None,
    timings: _Timings | None,
    feed: Callable[[_Ingest], None] | None = None,
) -> CacheWriteResult:
    """Write one planned source. ``feed`` replaces iterating ``plan.source``: it appends
    to the ingest (``set_schema`` + ``append_columns``) and calls ``complete()``."""
    prefetch_size, max_shard_bytes, compression, ratio = options
    # The library keeps the metadata columns and writes metadata.arrow itself.
    flags = _native.WriterFlag.METADATA
    if timings is not None:
        flags |= _native.WriterFlag.PROFILE
    if plan.replace:
        flags |= _native.WriterFlag.REPLACE
    writer_options = _native.WriterOptions(
        max_shard_bytes=max_shard_bytes,
        prefetch_size=prefetch_size,
        compression=compression,
        compression_ratio=ratio,
        flags=flags,
        fingerprint=plan.fingerprint,
    )
    try:
        # Native failures of this writer are this source's CacheWriteError.
        writer = _native.Writer.open(runtime, base, plan.name, writer_options, error=SourceFailure)
    except SourceFailure as failure:
        return CacheWriteError(plan.name, str(failure))
    try:
        # With a live progress line (or the profiler) batches stay small, so the line
        # moves even for slow sources; otherwise they are sized by BATCH_BYTES_MAX.
        small = progress is not None or timings is not None
        ingest = _Ingest(
            writer,
            plan.name,
            min(prefetch_size, BATCH_SAMPLES_MAX) if small else BATCH_SAMPLES_MAX,
            progress,
            timings,
            step=prefetch_size,
            direct=compression == _native.Compression.NONE,
        )
        if feed is None:
            ingest.run(plan.source)
        else:
            feed(ingest)
        writer.finish()
    except SourceFailure as failure:
        return CacheWriteError(plan.name, str(failure))
    finally:
        if timings is not None:
            timings.merge_native(writer)
        writer.close()
        if progress is not None:
            progress.source_done()
    return CacheWriteSuccess(plan.name, base / plan.name)


class _Ingest:
    """Pulls one source and feeds the native writer in columnar batches."""

    def __init__(
        self,
        writer: _native.Writer,
        name: str,
        batch_size: int,
        progress: _Progress | None,
        timings: _Timings | None,
        *,
        step: int,
        direct: bool = False,
    ) -> None:
        """``step``: samples pulled at a time (``prefetch_size``); ``direct``: hand large
        payloads over one by one, by pointer (uncompressed caches, where the library
        writes them from the caller's buffer)."""
        self.writer = writer
        self.direct = direct
        self.timings = timings
        self.name = name
        self.batch_size = batch_size
        # Samples pulled from the source at a time (the in-memory bound per step).
        self.step = max(1, min(step, batch_size))
        self.progress = progress
        self.keys: list[str] | None = None
        self.kinds: list[Kind] = []
        self.getters: list[Callable[[dict[str, Any]], Any]] = []
        self.plain_types: list[type] = []
        self.count = 0
        self.payload_bytes = 0
        # The values of the batch being pulled (for _take_each's error ordering).
        self._pending: list[list[Any]] | None = None

    def run(self, source: Any) -> None:
        try:
            iterator: Iterator[Any] = iter(source)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise SourceFailure(python_error(exc)) from exc
        if self.timings is not None:
            self._run_timed(iterator)
            return
        # Batches are pulled with islice (C speed) and checked in bulk; the first batch is
        # small, later ones are sized from the payload bytes seen so far.
        size = min(64, self.batch_size)
        more = True
        while more:
            # The cyclic GC is paused while a batch is pulled and handed over: its
            # samples stay alive until then, and collections would only promote them (a
            # pass over every tracked object of the process each time). Garbage from the
            # source waits at most one batch.
            paused = gc.isenabled()
            if paused:
                gc.disable()
            try:
                size, more = self._batch(iterator, size)
            finally:
                if paused:
                    gc.enable()
        self.complete()

    def _batch(self, iterator: Iterator[Any], size: int) -> tuple[int, bool]:
        """Pull up to ``size`` samples and hand them over; returns the next batch size and
        whether the source may have more.

        Samples are pulled ``step`` (at most ``prefetch_size``) at a time and the batch
        stops once its payloads reach BATCH_BYTES_MAX, so a source whose records grow
        from small to large holds at most BATCH_BYTES_MAX plus one step of samples.
        Each step is checked and taken apart (payloads, one list of values per field)
        as soon as it is pulled, and its tuples and metadata dicts are released then: at
        most one step of them is alive, so the source's next samples reuse their memory
        (and CPython's free lists) instead of allocating a batch's worth. A large payload
        that is a view of the caller's buffer ends the batch: it is written before the
        source runs again (``_pull``)."""
        payloads: list[Any] = []
        lengths: list[int] = []
        picked: list[list[Any]] = []
        self._pending = picked
        nbytes = 0
        more = True
        try:
            while len(payloads) < size and nbytes < BATCH_BYTES_MAX:
                want = min(self.step, size - len(payloads))
                step_payloads, rows, failure, cut = self._pull(iterator, want)
                if failure is not None:
                    # The samples pulled before the failure are checked first, as when
                    # each sample is checked as it arrives.
                    _, _, step_values = self._take(step_payloads, rows)
                    if self.keys is not None:
                        self._extend(picked, step_values)
                        self._check_values(picked)
                    raise failure
                pulled = len(step_payloads)
                step_payloads, step_lengths, step_values = self._take(step_payloads, rows)
                del rows
                payloads += step_payloads
                lengths += step_lengths
                nbytes += sum(step_lengths)
                self._extend(picked, step_values)
                if cut:
                    break
                if pulled < want:
                    more = False
                    break
        finally:
            self._pending = None
        count = len(payloads)
        if count == 0:
            return size, False
        self._flush(payloads, picked, lengths)
        average = max(1, nbytes // count)
        return max(1, min(self.batch_size, BATCH_BYTES_MAX // average)), more

    def _pull(
        self, iterator: Iterator[Any], want: int
    ) -> tuple[list[Any], list[dict[str, Any]], SourceFailure | None, bool]:
        """Pull up to ``want`` samples, taking each one apart before the next is pulled, as
        0.4.8 does: a source may refill one buffer and one dict for every sample. Returns
        the payloads, a copy of each sample's metadata dict, the failure that ended the
        pull (the source raised, or yielded something that is not a sample; raised once
        the samples before it are checked), and whether the pull stopped after a large
        payload that is a view of the caller's buffer (written before the next pull).

        A ``CacheInput`` (or 2-tuple) of ``bytes`` and a ``dict`` costs a C-level copy
        of the dict, and the item and its dict are released at once (CPython's free
        lists serve the source's next ones); anything else goes through ``_own``."""
        payloads: list[Any] = []
        rows: list[dict[str, Any]] = []
        add_payload = payloads.append
        add_row = rows.append
        # Locals: the loop runs per sample (a global or builtin lookup costs more).
        copy, kind, sample, pair, raw = dict.copy, type, CacheInput, tuple, bytes
        try:
            for item in islice(iterator, want):
                cls = kind(item)
                if cls is sample or (cls is pair and len(item) == 2):
                    data = item[0]
                    if kind(data) is raw:
                        try:
                            add_row(copy(item[1]))
                        except TypeError:  # not a dict: _own says so
                            pass
                        else:
                            add_payload(data)
                            continue
                try:
                    data, row = self._own(item)
                except SourceFailure as failure:
                    return payloads, rows, failure, False
                add_payload(data)
                add_row(row)
                if type(data) is memoryview:
                    return payloads, rows, None, True
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            failure = SourceFailure(python_error(exc))
            failure.__cause__ = exc
            return payloads, rows, failure, False
        return payloads, rows, None, False

    def _own(self, item: Any) -> tuple[Any, dict[str, Any]]:
        """One yielded item as this writer keeps it, before the source runs again: checked
        as 0.4.8 checks it (``SourceFailure``), its metadata dict copied, and a payload
        that is not ``bytes`` copied into ``bytes``, except a large one of an uncompressed
        cache, returned as a flat view (the caller writes it before the next pull)."""
        if not isinstance(item, tuple):
            raise SourceFailure("CacheSource must yield CacheInput tuples")
        if len(item) != 2:
            raise SourceFailure("CacheInput must contain data and metadata")
        data, metadata = item
        if type(data) is not bytes:
            data = _byte_view(data)
            if type(data) is memoryview and not (self.direct and len(data) >= LARGE_PAYLOAD_BYTES):
                data = data.tobytes()
        if not isinstance(metadata, dict):
            raise SourceFailure("metadata must be a dict")
        return data, dict.copy(metadata)

    @staticmethod
    def _extend(picked: list[list[Any]], values: list[list[Any]]) -> None:
        """Append a step's per-field values to the batch's (``picked`` starts empty)."""
        if not picked:
            picked.extend(values)
            return
        for column, step in zip(picked, values):
            column += step

    def _take(
        self, payloads: list[Any], rows: list[dict[str, Any]]
    ) -> tuple[list[Any], list[int], list[list[Any]]]:
        """Check pulled samples (as ``_pull`` returns them: payloads and metadata dicts
        as pulled) and take their metadata apart: the payloads, their lengths and, per
        schema field, the values (plain ``bool``/``int``/``float``/``str``, or ``str``
        subclasses for string fields). Raises the first failing sample's error, as a
        per-sample writer would, except for the int64 range and UTF-8 checks of the bulk
        path, which ``_flush`` (or the next error) makes with ``_check_values``.

        The bulk path is a few C-level passes over the step (``str.join`` is the type
        check of string values); anything unusual goes through ``_take_each``, one
        sample at a time."""
        if self.keys is not None and rows:
            try:
                picked = [list(map(getter, rows)) for getter in self.getters]
                # Every row holds the schema's (distinct) keys, so none has fewer; the
                # total then says that none has more: the key sets are equal.
                if sum(map(len, rows)) == len(rows) * len(self.getters) and all(
                    "\0".join(values) is not None  # the type check: str (subclasses too)
                    if kind == Kind.STRING
                    else _all_exactly(cls, values)
                    for values, cls, kind in zip(picked, self.plain_types, self.kinds)
                ):
                    return payloads, list(map(len, payloads)), picked
            except (TypeError, KeyError):
                pass
        return self._take_each(payloads, rows)

    def _take_each(
        self, payloads: list[Any], rows: list[dict[str, Any]]
    ) -> tuple[list[Any], list[int], list[list[Any]]]:
        """``_take`` one sample at a time: every check of a sample before the next one
        (after those of the batch's earlier samples, ``_check_values``)."""
        picked: list[list[Any]] = [[] for _ in self.keys or ()]
        for row in rows:
            try:
                if self.keys is None:  # the first sample sets the schema
                    self._infer_schema(row)
                    picked = [[] for _ in self.keys or ()]
                values = self._row_values(row)
            except SourceFailure:
                if self._pending:
                    self._check_values(self._pending)
                # Error path only: the row's first fault in 0.4.8's order wins.
                fault = _entry_failure(row)
                if fault is None:
                    raise
                raise fault from None
            for column, value in zip(picked, values):
                column.append(value)
        return payloads, list(map(len, payloads)), picked

    def _check_values(self, picked: list[list[Any]]) -> None:
        """Raise the first int64-range, non-finite float or UTF-8 error among a batch's
        values (in sample order; within a sample, a value 0.4.8 rejects as being of no
        kind first, then field order), if any: the checks the bulk path of ``_take``
        leaves for later."""
        assert self.keys is not None
        # (sample index, 0 for 0.4.8's value error else 1, field position, message)
        first: tuple[int, int, int, str] | None = None
        for position, (key, kind, values) in enumerate(zip(self.keys, self.kinds, picked)):
            bad: tuple[int, int, int, str] | None = None
            if kind == Kind.INT and values:
                if min(values) < INT64_MIN or max(values) > INT64_MAX:
                    index = next(i for i, v in enumerate(values) if not INT64_MIN <= v <= INT64_MAX)
                    message = _int_range_message(key, values[index])
                    bad = (index, int(message != VALUE_TYPES_MESSAGE), position, message)
            elif kind == Kind.FLOAT and values:
                # (the library checks this too, but only once the batch is handed over)
                finite = list(map(math.isfinite, values))
                if not all(finite):
                    message = f"metadata field '{key}' must be a finite float"
                    bad = (finite.index(False), 1, position, message)
            elif kind == Kind.STRING:
                joined = "\0".join(values)
                if not joined.isascii():
                    try:
                        joined.encode("utf-8")
                    except UnicodeEncodeError:
                        for index, value in enumerate(values):
                            try:
                                str.__str__(value).encode("utf-8")
                            except UnicodeEncodeError:
                                bad = (index, 0, position, VALUE_TYPES_MESSAGE)
                                break
            if bad is not None and (first is None or bad < first):
                first = bad
        if first is not None:
            raise SourceFailure(first[3])

    def _row_values(self, row: dict[str, Any]) -> list[Any]:
        """One sample's metadata as plain values in schema order, or an error for its
        first problem (key set, then per key: missing, int64 range, kind, finite float,
        UTF-8). ``_take_each`` replaces the error with the row's first fault in 0.4.8's
        order (``_entry_failure``), if it has one."""
        assert self.keys is not None
        if len(row) != len(self.keys):
            raise SourceFailure("metadata keys must be identical for every sample")
        values: list[Any] = []
        for key, kind in zip(self.keys, self.kinds):
            if key not in row:
                raise SourceFailure(f"metadata field '{key}' is missing")
            # A subclass of int, float or str stores the value it holds, as in 0.4.8,
            # not what its __int__, __float__ or __str__ (an Enum's name) returns.
            got, value = metadata_value(row[key])
            if got == Kind.INT and not INT64_MIN <= value <= INT64_MAX:
                # an int 0.4.8 would store as a float, whatever the field's kind
                raise SourceFailure(_int_range_message(key, value))
            if got != kind:
                raise SourceFailure(
                    f"metadata field '{key}' expected {KIND_NAMES[kind]}, got {KIND_NAMES[got]}"
                )
            if kind == Kind.STRING:
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise SourceFailure(VALUE_TYPES_MESSAGE) from exc
            elif kind == Kind.FLOAT and not math.isfinite(value):
                raise SourceFailure(f"metadata field '{key}' must be a finite float")
            values.append(value)
        return values

    def _run_timed(self, iterator: Iterator[Any]) -> None:
        """``run`` with the profiler's per-sample timings (one sample at a time)."""
        pull = iterator.__next__
        payloads: list[Any] = []
        picked: list[list[Any]] = []
        timings = self.timings
        assert timings is not None
        clock = time.perf_counter_ns
        batch_size = self.batch_size
        try:
            while True:
                self._pending = picked
                started = clock()
                try:
                    item = pull()
                except StopIteration:
                    # the call that ends the source is a next() too (as 0.4.8)
                    timings.add("python_next", started)
                    break
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as exc:
                    timings.add("python_next", started)
                    if picked:
                        self._check_values(picked)
                    raise SourceFailure(python_error(exc)) from exc
                timings.add("python_next", started)
                started = clock()
                data, row = self._own(item)
                taken_payloads, _, taken_values = self._take([data], [row])
                payloads.append(taken_payloads[0])
                self._extend(picked, taken_values)
                timings.add("python_extract", started, len(payloads[-1]))
                # A view of the caller's buffer is written before the source runs again,
                # and no reference to it is left then (the source may resize the buffer).
                if len(payloads) >= batch_size or type(data) is memoryview:
                    self._flush(payloads, picked)
                    payloads, picked = [], []
                del item, data, row, taken_payloads
        finally:
            self._pending = None
        if payloads:
            self._flush(payloads, picked)
        self.complete()

    def complete(self) -> None:
        """After the last append: refuse an empty source (the library writes
        ``metadata.arrow`` when the writer finishes)."""
        if self.count == 0:
            raise SourceFailure("cache source yielded no samples")

    def _infer_schema(self, metadata: dict[Any, Any]) -> None:
        """Set the schema from the first sample's metadata (its errors are replaced by
        the row's first fault in 0.4.8's order, see ``_take_each``)."""
        failure = _entry_failure(metadata)  # also each key's UTF-8, before the native call
        if failure is not None:
            raise failure
        # No keys at all is a schema too: such caches have a metadata.arrow with one row
        # per sample and no columns, which 0.4.8 reads back (it fails to write them).
        keys = sorted(metadata, key=lambda k: k.encode("utf-8", "surrogatepass"))
        self.set_schema(keys, [value_kind(metadata[key]) for key in keys])

    def set_schema(self, keys: list[str], kinds: list[Kind]) -> None:
        """Set the schema: ``keys`` sorted by their UTF-8 bytes, one Kind per key."""
        for key in keys:
            if key in RESERVED_KEYS:
                raise SourceFailure(f"metadata field '{key}' is reserved")
        self.kinds = kinds
        self.keys = keys
        self.getters = [itemgetter(key) for key in keys]
        self.plain_types = [_PLAIN_TYPES[kind] for kind in kinds]
        self.writer.set_schema(keys, kinds)

    def _column(self, kind: Kind, values: list[Any]) -> tuple[Any, Any]:
        """Typed column for one field of a batch: (numpy array or string bytes, offsets).
        ``values`` are as ``_take`` returns them; an int outside int64 raises
        OverflowError, a string that is not UTF-8 encodable UnicodeEncodeError."""
        import numpy as np

        if kind == Kind.STRING:
            fast = (_constant_strings(values) if values else None) or _joined_strings(values)
            if fast is not None:
                return fast
            # Some value holds a NUL: encode one by one.
            encoded = [value.encode("utf-8") for value in values]
            offsets = np.zeros(len(encoded) + 1, dtype=np.uint64)
            np.cumsum(np.fromiter(map(len, encoded), np.uint64, len(encoded)), out=offsets[1:])
            return b"".join(encoded), offsets
        # Per value, ``bytes()`` costs ~94 instructions (callgrind, 4,096 small ints, with
        # the conversion to int64), ``np.fromiter`` ~206 and ``np.array`` ~305 (it
        # discovers each value's type first): small non-negative ints (class labels) and
        # bools take ``bytes()``, other values ``np.fromiter``. Both raise OverflowError
        # for an int outside int64, as ``np.array`` does.
        if kind == Kind.INT:
            try:
                small = bytes(values)
            except ValueError:  # a value outside 0..255
                return np.fromiter(values, dtype=np.int64, count=len(values)), None
            return np.frombuffer(small, dtype=np.uint8).astype(np.int64), None
        if kind == Kind.FLOAT:
            return np.fromiter(values, dtype=np.float64, count=len(values)), None
        return np.frombuffer(bytes(values), dtype=np.uint8), None

    def _flush(
        self,
        payloads: Sequence[Any],
        picked: list[list[Any]],
        payload_lengths: list[int] | None = None,
    ) -> int:
        """Hand one batch to the native writer; returns its payload bytes. ``picked``
        holds each schema field's values (as ``_take`` returns them); ``payload_lengths``
        the payloads' lengths, if already known."""
        import numpy as np

        assert self.keys is not None
        started = time.perf_counter_ns() if self.timings else 0
        try:
            values = [self._column(kind, column) for kind, column in zip(self.kinds, picked)]
        except (OverflowError, UnicodeEncodeError):
            self._check_values(picked)  # raises the first sample's error
            raise
        count = len(payloads)
        if payload_lengths is None:
            payload_lengths = list(map(len, payloads))
        # Fixed-size records (common) skip converting every length to numpy.
        size = _uniform_length(payload_lengths) if count else None
        if size is None:
            lengths = np.array(payload_lengths, dtype=np.uint64)
            nbytes = int(lengths.sum())
        else:
            nbytes = size * count
        if self.direct and nbytes >= LARGE_PAYLOAD_BYTES * count:
            # Large payloads: by pointer, written from their own buffers.
            if size is not None:
                lengths = np.full(count, size, dtype=np.uint64)
            if self.timings:
                self.timings.add("metadata_validate", started)
            self.append_columns(count, payloads, lengths, values, views=True)
            return nbytes
        if size is None:
            offsets = np.zeros(count + 1, dtype=np.uint64)
            np.cumsum(lengths, out=offsets[1:])
        else:
            offsets = np.arange(count + 1, dtype=np.uint64) * np.uint64(size)
        blob = b"".join(payloads)
        if self.timings:
            self.timings.add("metadata_validate", started)
        self.append_columns(count, blob, offsets, values)
        return nbytes

    def append_columns(
        self,
        count: int,
        blob: Any,
        offsets: Any,
        values: list[tuple[Any, Any]],
        *,
        views: bool = False,
    ) -> None:
        """Hand ``count`` samples to the native writer in one call (which keeps their
        metadata for ``metadata.arrow``).

        ``blob`` is a buffer of payload bytes, ``offsets`` a C-contiguous uint64 array of
        ``count + 1`` byte offsets into it; with ``views``, ``blob`` is a sequence of
        ``count`` payload buffers and ``offsets`` their ``count`` lengths (uint64), passed
        one pointer each and written from where they are.
        ``values`` holds one ``(values, offsets)`` pair per schema field as
        :meth:`_column` returns them (numpy arrays; for strings, UTF-8 bytes and uint64
        offsets starting at 0). The schema must be set."""
        import numpy as np

        assert self.keys is not None
        started = time.perf_counter_ns() if self.timings else 0
        columns = [(kind, v, o) for kind, (v, o) in zip(self.kinds, values)]
        if views:
            # One call per payload, its own buffer by pointer: the library writes large
            # payloads from there (and hashes them as written), without a copy. Row i of
            # `bounds` is payload i's offsets [0, size] (a contiguous view: no array is
            # built per payload).
            bounds = np.zeros((count, 2), dtype=np.uint64)
            bounds[:, 1] = offsets
            append = self.writer.append
            for i, payload in enumerate(blob):
                one = [
                    (kind, v[i : i + 1], None) if o is None else (kind, v, o[i : i + 2])
                    for kind, v, o in columns
                ]
                append(1, payload, bounds[i], one)
            nbytes = int(bounds[:, 1].sum())
        else:
            self.writer.append(count, blob, offsets, columns)
            nbytes = len(blob)
        if self.timings:
            self.timings.add("ingress_wait", started, nbytes)
        self.count += count
        self.payload_bytes += nbytes
        if self.progress is not None:
            self.progress.update(self.name, self.count, self.payload_bytes)


class _Progress:
    """A live stderr line per source while writing, only when stderr is a terminal."""

    def __init__(self, total_sources: int) -> None:
        self.total_sources = total_sources
        self.done = 0
        self.started = time.monotonic()
        self.source_started = self.started
        self.last_draw = 0.0

    @classmethod
    def create(cls, enabled: bool, total_sources: int) -> _Progress | None:
        if not enabled or not sys.stderr.isatty():
            return None
        return cls(total_sources)

    def update(self, name: str, samples: int, payload_bytes: int) -> None:
        now = time.monotonic()
        if now - self.last_draw < 0.2:
            return
        self.last_draw = now
        elapsed = max(now - self.source_started, 1e-9)
        line = (
            f"writing {name} {samples} items | {samples / elapsed:,.0f} items/s | "
            f"{payload_bytes / elapsed / 1e6:,.1f} MB/s"
        )
        if self.total_sources > 1:
            prefix = f"sources {self.done}/{self.total_sources}"
            if self.done:
                per_source = (self.source_started - self.started) / self.done
                remaining = per_source * (self.total_sources - self.done) - (
                    now - self.source_started
                )
                prefix += f" ETA {max(remaining, 0.0):,.0f}s"
            line = f"{prefix} | " + line
        sys.stderr.write("\r\x1b[2K" + line)
        sys.stderr.flush()

    def source_done(self) -> None:
        self.done += 1
        self.source_started = time.monotonic()
        sys.stderr.write("\r\x1b[2K")
        if self.done == self.total_sources:
            elapsed = time.monotonic() - self.started
            sys.stderr.write(f"wrote {self.done} source(s) in {elapsed:.1f}s\n")
        sys.stderr.flush()
