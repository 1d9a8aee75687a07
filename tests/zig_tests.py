"""`zig build test` (the Zig unit tests), run beside the Python tests.

The Zig unit tests keep one core busy for a minute or two, while most Python tests leave
the second core of a 2-core machine idle. So the session starts them in the background
as soon as it knows they were selected (``conftest.py``, after collection), and
``tests/test_native.py::test_zig_unit_tests`` waits for their result. Run alone, that
test starts them itself. The session kills them if it ends first (``-x``, Ctrl-C).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
# Debug: every safety check on (build.zig compiles the tests with LLVM).
COMMAND = [sys.executable, "-m", "ziglang", "build", "test", "-Doptimize=Debug"]
COMMAND += ["--summary", "all"]
TIMEOUT_S = 900


class _Run:
    """One `zig build test` process, its output in a temporary file (a pipe nobody reads
    until the end could fill and stall it) and its start time."""

    def __init__(self) -> None:
        self.output: IO[bytes] = tempfile.TemporaryFile()
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            COMMAND,
            cwd=ROOT,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, to stop it whole
        )

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


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
