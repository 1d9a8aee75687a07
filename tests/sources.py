"""Picklable test sources (importable from spawned writer processes)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import dataset_rt as drt


class Numbers:
    """`count` samples of `size` deterministic bytes with int/str metadata."""

    def __init__(self, name: str, count: int = 20, size: int = 64) -> None:
        self.name = name
        self.count = count
        self.size = size

    def __iter__(self):
        for i in range(self.count):
            yield drt.CacheInput(bytes([i % 251]) * self.size, {"i": i, "tag": f"{self.name}-{i}"})


class Failing(Numbers):
    def __iter__(self):
        yield from list(super().__iter__())[:3]
        raise RuntimeError("boom in child")


class Slow(Numbers):
    def __iter__(self):
        for sample in super().__iter__():
            time.sleep(0.05)
            yield sample


class Interrupting(Numbers):
    def __iter__(self):
        yield from list(super().__iter__())[:2]
        raise KeyboardInterrupt("stop")


class SelfSignal(Numbers):
    """Sends itself SIGINT half way through (a real Ctrl-C during a write)."""

    def __iter__(self):
        for i, sample in enumerate(super().__iter__()):
            if i == self.count // 2:
                os.kill(os.getpid(), signal.SIGINT)
            yield sample


class Exiting(Numbers):
    """Ends its process with exit code 3 half way through (a writer process dying)."""

    def __iter__(self):
        for i, sample in enumerate(super().__iter__()):
            if i == self.count // 2:
                os._exit(3)
            yield sample


class Mixed:
    """Payloads of 0 to ``longest`` bytes; int, float, bool and str metadata."""

    def __init__(self, name: str, count: int, longest: int = 8) -> None:
        self.name = name
        self.count = count
        self.longest = longest

    def __iter__(self) -> Iterator[drt.CacheInput]:
        for i in range(self.count):
            payload = bytes((i * 7 + k) % 256 for k in range(i % (self.longest + 1)))
            metadata = {"n": i - 5, "x": i / 4, "odd": bool(i % 2), "label": f"{self.name}-{i}"}
            yield drt.CacheInput(payload, metadata)


class InterruptingOpaque(Numbers):
    """Raises a KeyboardInterrupt whose argument cannot be pickled."""

    def __iter__(self):
        import threading

        yield from list(super().__iter__())[:2]
        raise KeyboardInterrupt(threading.Lock())


class BadStrError(Exception):
    """An exception whose ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("str failed")


class FailingBadStr(Numbers):
    """Yields a few samples, then raises a BadStrError."""

    def __iter__(self):
        yield from list(super().__iter__())[:3]
        raise BadStrError("x")
