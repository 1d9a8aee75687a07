"""Reused batch memory: rings of bytes whose space comes back when the last view dies.

A batch built in fresh memory pays its page faults every time (a new 64 MiB array costs
about as much as copying 64 MiB); a batch built in memory that is reused does not. The
memory is a ring: batches take space in order and give it back in order once every
view of them is gone, whatever order they are dropped in. The ring never waits for the
caller: a batch that does not fit now (the caller keeps many) gets fresh memory instead
(owned by its arrays), so a consumer that keeps every batch never makes a ring grow.

- :class:`Releases`: in-order release of ring positions, driven by the death of the
  regions it hands out (each region is its own array object: numpy views of it keep it,
  and so its space, alive).
- :class:`Pool`: one ring in this process's memory (faulted in once, by its first lap).
- :func:`span`, :func:`fit`: ring arithmetic shared with the PyTorch loader's rings of
  shared memory (``integrations/torch.py``), which use :class:`Releases` the same way.

Plain Python and numpy; nothing here touches the native library.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

# Every region starts on a cache line, so int64/float64 sections laid out in it at
# 8-byte multiples stay aligned.
ALIGN = 64


def span(nbytes: int) -> int:
    """Ring space taken by a region of ``nbytes`` (rounded up to :data:`ALIGN`)."""
    return (nbytes + ALIGN - 1) & ~(ALIGN - 1)


def fit(produced: int, consumed: int, capacity: int, nbytes: int) -> int | None:
    """The ring position of ``nbytes`` contiguous bytes free now, or None. Positions
    count bytes ever produced (``produced``) and given back (``consumed``); a region
    never wraps: the tail it skips is given back with it. Positions stay aligned when
    ``capacity`` and every ``nbytes`` are (see :func:`span`)."""
    start = produced
    offset = start % capacity
    if offset + nbytes > capacity:
        start += capacity - offset
    if nbytes > capacity or start + nbytes - consumed > capacity:
        return None
    return start


def own_array(array: np.ndarray) -> np.ndarray:
    """A uint8 array over ``array``'s bytes that is its own object for numpy's views:
    numpy collapses a view of a view onto the array that owns the memory, so a plain
    slice's views would not keep the slice alive; views of this one do (its base is a
    memoryview)."""
    return np.frombuffer(memoryview(array), dtype=np.uint8)


class Releases:
    """In-order release of ring space whatever order regions are dropped in:
    ``publish`` gets the end of the longest released prefix. Thread-safe (regions die on
    any thread: torch's pin-memory thread drops batches too)."""

    __slots__ = ("_lock", "_pending", "_publish")

    def __init__(self, publish: Callable[[int], None]) -> None:
        self._lock = threading.Lock()
        self._pending: deque[list[Any]] = deque()
        self._publish = publish

    def view(
        self, array: np.ndarray, at: int, nbytes: int, end: int
    ) -> tuple[np.ndarray, list[Any]]:
        """``array[at : at + nbytes]`` as its own array (see :func:`own_array`), whose
        space is released up to ring position ``end`` once it and every view of it are
        gone, and the entry that records it (for :meth:`retarget`)."""
        region = own_array(array[at : at + nbytes])
        entry = [end, False]
        with self._lock:
            self._pending.append(entry)
        weakref.finalize(region, self._release, entry)
        return region, entry

    def retarget(self, entry: list[Any], end: int) -> None:
        """Release only up to ``end`` for ``entry`` (the latest, trimmed)."""
        with self._lock:
            entry[0] = end

    def _release(self, entry: list[Any]) -> None:
        with self._lock:
            entry[1] = True
            pending = self._pending
            end = None
            while pending and pending[0][1]:
                end = pending.popleft()[0]
            if end is not None:
                self._publish(end)


def _publish(pool: Callable[[], Pool | None], end: int) -> None:
    alive = pool()
    if alive is not None:
        alive.consumed = end


class Pool:
    """A ring of ``capacity`` bytes in this process's memory: its pages are faulted in
    by the first lap around it, later laps fault nothing. Bounded: :meth:`take` returns
    None instead of growing. Thread-safe."""

    __slots__ = (
        "__weakref__",
        "_lock",
        "array",
        "capacity",
        "consumed",
        "pid",
        "produced",
        "releases",
    )

    def __init__(self, capacity: int) -> None:
        if capacity <= 0 or capacity % ALIGN:
            raise ValueError(f"a pool's capacity must be a positive multiple of {ALIGN}")
        self.pid = os.getpid()
        self.capacity = capacity
        # Pages are faulted in by the first lap (once), not all before the first batch.
        self.array = np.empty(capacity, dtype=np.uint8)
        self.produced = 0
        self.consumed = 0
        self._lock = threading.Lock()
        # Through a weak reference: no cycle, so a pool nothing uses any more is freed at
        # once, not at the next garbage collection (its array lives on in its regions).
        self.releases = Releases(functools.partial(_publish, weakref.ref(self)))

    def take(self, nbytes: int) -> tuple[np.ndarray, list[Any], int] | None:
        """``(region, entry, start)``: ``nbytes`` of the ring, given back once the region
        and every view of it are gone; ``start`` is its ring position (for
        :meth:`trim`). None when they do not fit now."""
        with self._lock:
            size = span(nbytes)
            start = fit(self.produced, self.consumed, self.capacity, size)
            if start is None:
                return None
            self.produced = start + size
            # Registered under the lock: releases go in ring order, so two threads
            # taking at once must register in the order they reserved.
            region, entry = self.releases.view(
                self.array, start % self.capacity, nbytes, start + size
            )
        return region, entry, start

    def trim(self, entry: list[Any], start: int, nbytes: int) -> None:
        """Give back all but the first ``nbytes`` of the latest region taken (at ring
        position ``start``), for the next :meth:`take`."""
        with self._lock:
            end = start + span(nbytes)
            if self.produced != entry[0] or end > self.produced:
                return  # not the latest region (or not a shrink): keep it whole
            self.produced = end
            self.releases.retarget(entry, end)
