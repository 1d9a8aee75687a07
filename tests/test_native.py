"""The Zig unit tests, and the C ABI's exported symbols against the header."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import zig_tests
from sources import Numbers

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "native" / "include" / "dataset_rt.h"


def test_zig_unit_tests() -> None:
    """`zig build test` (Debug: every safety check on) passes. The session started it
    beside the Python tests (tests/zig_tests.py)."""
    returncode, output = zig_tests.result()
    assert returncode == 0, output
    summary = re.search(r"(\d+) passed", output)
    assert summary and int(summary.group(1)) > 0, output


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie nobody reaped yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_background_run_dies_with_pytest(tmp_path: Path) -> None:
    """A `zig build test` started in the background does not outlive the pytest process
    that started it when that process alone is killed (SIGKILL: no cleanup runs): its
    guard kills it and what it started. Checked with a stand-in command (a process and
    its child, both sleeping)."""
    pids = tmp_path / "pids"
    command = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pids)!r}, "w").write(f"{{child.pid}}")
        time.sleep(300)
    """)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; sys.path.insert(0, sys.argv[1]); import zig_tests;"
            "zig_tests._Run([sys.executable, '-c', sys.argv[2]]); time.sleep(300)",
            str(Path(__file__).parent),
            command,
        ]
    )
    deadline = time.monotonic() + 60
    while not (pids.exists() and pids.read_text()):
        assert time.monotonic() < deadline and parent.poll() is None, "stand-in never started"
        time.sleep(0.05)
    grandchild = int(pids.read_text())
    below = zig_tests._descendants(parent.pid)
    assert grandchild in below and len(below) == 3  # guard, command, its child
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in below):
        assert time.monotonic() < deadline, f"still running: {[p for p in below if _alive(p)]}"
        time.sleep(0.05)


def header_functions() -> set[str]:
    """Names of the functions declared in the header's cdef region."""
    text = HEADER.read_text()
    region = text[text.index("/* DRT_CDEF_BEGIN */") : text.index("/* DRT_CDEF_END */")]
    region = re.sub(r"/\*.*?\*/", "", region, flags=re.S)
    return set(re.findall(r"\b(drt_[a-z0-9_]+)\s*\(", region))


def test_exported_symbols_match_header() -> None:
    """Every exported drt_* symbol is declared in the header, and vice versa."""
    from dataset_rt import _native

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("binutils nm is not installed")
    output = subprocess.run(
        [nm, "-D", "--defined-only", _native.library_path()],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = {line.split()[-1] for line in output.splitlines() if " T drt_" in line}
    declared = header_functions()
    assert exported == declared, (sorted(exported - declared), sorted(declared - exported))


def test_abi_version_and_errors() -> None:
    from dataset_rt._native import ffi, lib

    assert lib.drt_abi_version() >> 16 == lib.DRT_ABI_VERSION_MAJOR
    assert ffi.string(lib.drt_version()).decode() == "0.1.0"
    out = ffi.new("drt_runtime **")
    assert lib.drt_runtime_open(0, out) == lib.DRT_E_INVALID_ARGUMENT
    assert ffi.string(lib.drt_last_error()) == b"num_workers must be greater than zero"
    assert lib.drt_runtime_open(1, ffi.NULL) == lib.DRT_E_INVALID_ARGUMENT
    lib.drt_runtime_close(ffi.NULL)


def test_a_successful_call_leaves_no_error_message(runtime, tmp_path: Path) -> None:
    """docs/c-api.md: a successful call clears the thread's last error. A contiguous batch
    that stops before a record it cannot decode succeeds, and its failure is the next
    call's, with the message naming the shard; the success itself leaves no message."""
    import struct

    import dataset_rt as drt
    from dataset_rt import _native

    config = drt.WriterConfig(show_progress=False)
    [result] = runtime.write_cache(Numbers("a", count=12), tmp_path, writer_config=config)
    cache = Path(result.path)
    _, offset, _ = struct.unpack_from("<QQQ", (cache / "index.bin").read_bytes(), 5 * 24)
    shard = cache / "shards" / "000000.bin"
    data = bytearray(shard.read_bytes())
    data[offset + 8 : offset + 12] = b"\xff\xfe{{"  # record 5's metadata JSON
    shard.write_bytes(bytes(data))
    config = drt.ReaderConfig(seed=0, shuffle=False)
    iterator = _native.Iterator.open(runtime.cached_dataset([cache], reader_config=config)._handle)
    counts = []
    with pytest.raises(RuntimeError, match=f"JSON error: .*: {shard}$"):
        for _ in range(12):
            counts.append(iterator.next_batch(4, _native.BatchFlag.CONTIGUOUS).count)
            assert _native.last_error() == ""
    assert counts == [4, 1]  # the second batch stops before record 5
