"""The only module that touches the native library.

Loads ``libdataset_rt.so`` from this package's directory (or from the path in the
developer override ``DATASET_RT_LIBRARY``; there is no search), through the out-of-line
cffi ABI module ``dataset_rt._ffi`` generated at build time from ``dataset_rt.h``. Status
codes become exceptions in one place, :func:`check`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from dataset_rt._ffi import ffi

LIBRARY_ENV = "DATASET_RT_LIBRARY"
ABI_MAJOR = 1

_library_path = os.environ.get(LIBRARY_ENV) or str(Path(__file__).with_name("libdataset_rt.so"))
lib: Any = ffi.dlopen(_library_path)

if (lib.drt_abi_version() >> 16) != ABI_MAJOR:
    raise ImportError(
        f"{_library_path} has C ABI "
        f"{lib.drt_abi_version() >> 16}.{lib.drt_abi_version() & 0xFFFF}; "
        f"this dataset_rt needs ABI {ABI_MAJOR}.x"
    )

NULL = ffi.NULL


class NativeError(Exception):
    """Base of the errors carrying a native status (never raised bare)."""


def last_error() -> str:
    """This thread's last native error message."""
    return ffi.string(lib.drt_last_error()).decode("utf-8", "replace")


def raise_status(status: int) -> NoReturn:
    """Raise the documented Python exception for a failing native status."""
    message = last_error()
    if status in (lib.DRT_E_INVALID_ARGUMENT, lib.DRT_E_INVALID_CACHE, lib.DRT_E_EXISTS):
        raise ValueError(message)
    if status == lib.DRT_E_INDEX:
        raise IndexError(message)
    if status == lib.DRT_E_OUT_OF_MEMORY:
        raise MemoryError(message)
    if status == lib.DRT_E_OVERFLOW:
        raise OverflowError(message)
    # DRT_E_IO, DRT_E_JSON, DRT_E_ARROW, DRT_E_FORKED, DRT_E_INTERNAL
    raise RuntimeError(message)


def check(status: int) -> None:
    """Raise for a non-zero native status; return None for DRT_OK."""
    if status != 0:
        raise_status(status)


FORK_MESSAGE = (
    "dataset_rt objects cannot be used in a forked child process; "
    "create the runtime and dataset in the child"
)


def check_owner(pid: int) -> None:
    """Raise the fork error when called in a process other than ``pid``.

    The native handles refuse a forked child on their own; this guards the Python-side
    paths that would otherwise hang there first (Polars' thread pool, inherited from the
    parent, deadlocks in a forked child) or report the error as a per-source result."""
    if os.getpid() != pid:
        raise RuntimeError(FORK_MESSAGE)


def encode_path(path: str | os.PathLike[str]) -> bytes:
    """A path as the bytes the OS sees (surrogate-escaped names round-trip)."""
    return os.fsencode(path)


class PathArray:
    """A ``drt_str[]`` of paths (``.array``, ``.count``) for one native call. Keep the
    object alive for the call: it owns the encoded bytes the entries point into."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        self._encoded = [encode_path(p) for p in paths]
        self.count = len(self._encoded)
        self.array = ffi.new("drt_str[]", max(1, self.count))
        for entry, raw in zip(self.array, self._encoded):
            entry.ptr = ffi.from_buffer(raw)
            entry.len = len(raw)


def library_path() -> str:
    """Where the loaded library came from."""
    return _library_path
