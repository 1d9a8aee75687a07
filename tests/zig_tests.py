"""`zig build test` (the Zig unit tests), run beside the Python tests.

The Zig unit tests keep one core busy for a minute or two, while most Python tests leave
the second core of a 2-core machine idle. So the session starts them in the background
as soon as it knows they were selected (``conftest.py``, after collection), and
``tests/test_native.py::test_zig_unit_tests`` waits for their result. Run alone, that
test starts them itself. The session kills them if it ends first (``-x``, Ctrl-C); they
stay in pytest's process group, so a signal to the group (a CI timeout) reaches them too.
A pytest process killed alone (``kill -9 <pid>``) cannot kill them, so they run under a
guard (this file run as a script) that kills them when pytest's end of its stdin closes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
# Debug: every safety check on (build.zig compiles the tests with LLVM).
COMMAND = [sys.executable, "-m", "ziglang", "build", "test", "-Doptimize=Debug"]
COMMAND += ["--summary", "all"]
TIMEOUT_S = 900


class _Run:
    """One `zig build test` process (``command``) under its guard (see :func:`_guard`), its
    output in a temporary file (a pipe nobody reads until the end could fill and stall it)
    and its start time."""

    def __init__(self, command: list[str] = COMMAND) -> None:
        self.output: IO[bytes] = tempfile.TemporaryFile()
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, __file__, *command],
            cwd=ROOT,
            # The guard's stdin: this process holds the only write end, so the guard
            # reads end of file when this process is gone, however it ended.
            stdin=subprocess.PIPE,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            # In pytest's process group: what stops the session's group (Ctrl-C, a CI
            # timeout, `timeout`) stops it too.
        )

    def kill(self) -> None:
        """Kill the guard, `zig build` and the processes it started (the compiler, the
        tests)."""
        if self.process.poll() is None:
            for pid in [*_descendants(self.process.pid), self.process.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.process.wait()


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (from /proc), children before their parents' parents."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found[::-1]


_run: _Run | None = None  # this session's run, started at most once


def start() -> None:
    """Start the unit tests in the background (once per session)."""
    global _run
    if _run is None:
        _run = _Run()


def result() -> tuple[int, str]:
    """Wait for the unit tests (starting them if needed) and return their exit status and
    output. Raises ``subprocess.TimeoutExpired`` (after killing them) when they take more
    than ``TIMEOUT_S`` from their start."""
    start()
    assert _run is not None
    left = max(1.0, TIMEOUT_S - (time.monotonic() - _run.started))
    try:
        returncode = _run.process.wait(timeout=left)
    except subprocess.TimeoutExpired:
        _run.kill()
        raise
    _run.output.seek(0)
    return returncode, _run.output.read().decode(errors="replace")


def stop() -> None:
    """Kill the unit tests if they still run (the session ended without waiting)."""
    if _run is not None:
        _run.kill()


def _guard(command: list[str]) -> int:
    """Run ``command`` and return its exit status; kill it and everything it started as
    soon as stdin reaches end of file (the process that started the guard is gone).

    Ctrl-C reaches ``command`` directly (same process group) and the guard waits for it
    to end, so it ignores SIGINT with a handler (an ignored disposition would be
    inherited through ``exec`` by ``command``)."""
    signal.signal(signal.SIGINT, lambda *_: None)
    child = subprocess.Popen(command, stdin=subprocess.DEVNULL)

    def watch() -> None:
        # The raw descriptor: a thread blocked in sys.stdin's buffered read holds its lock,
        # which the interpreter's shutdown then cannot take (a fatal error).
        while os.read(0, 4096):
            pass
        for pid in [*_descendants(child.pid), child.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    threading.Thread(target=watch, daemon=True).start()
    return child.wait()


if __name__ == "__main__":
    status = _guard(sys.argv[1:])
    # Without the interpreter's shutdown, which would wait on nothing but could trip over
    # the watching thread; a signal's death as a shell reports it.
    os._exit(status if status >= 0 else 128 - status)
