"""Helpers shared by the benchmark scripts in ``benchmarks/``.

- Timing: :func:`best_of` (warm-up passes, then the best of ``repeat`` timed passes, each
  after an untimed ``setup``).
- Page cache: :func:`drop_page_cache` evicts a file's or a directory tree's pages with
  ``posix_fadvise(DONTNEED)`` after an ``fsync`` (the kernel only drops clean pages), and
  :func:`resident_fraction` checks with ``mincore`` that it worked.
- Machine limits measured in the same run (:func:`measure_limits`): page-cache read and
  memcpy bandwidth, cold sequential and cold random 1 MiB read bandwidth, and two
  pure-Python per-sample loops that set the floor for per-sample APIs.
- The reference release, dataset-rt 0.4.8, in its own virtualenv (:class:`Reference`):
  it shares this project's import name, so it never runs in this process; scripts run
  there as isolated subprocesses and print JSON.
- :func:`machine_facts` and :func:`print_table` for the report.

The functions listed in :data:`PORTABLE` use only the standard library, so their source
is also sent to the reference's interpreter: both sides are timed and verified by the same
code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

MiB = 1 << 20
CHUNK_BYTES = 4 * MiB
#: 1 MiB reads of the cold random-read limits (``cold_files_bps``), at depth 1.
COLD_RANDOM_READS = 256
DIGEST_BYTES = 16


# ------------------------------------------------------------------ portable helpers
# Standard library only: their source is shipped to the reference's interpreter too.


def best_of(
    fn: Callable[[Any], Any],
    repeat: int,
    warmup: int = 1,
    setup: Callable[[], Any] | None = None,
    budget_s: float | None = None,
) -> tuple[float, list[float], Any]:
    """Best wall time of ``fn(setup())`` over up to ``repeat`` timed runs.

    ``warmup`` untimed runs come first. ``setup`` (untimed) runs before every call and
    its result is ``fn``'s argument (None without a setup). Once ``budget_s`` seconds
    have gone by, no further timed run starts (at least one always runs). Returns
    (best seconds, every timed run's seconds, the last run's result).
    """
    import time as _time

    start = _time.perf_counter()
    result = None
    for _ in range(warmup):
        result = fn(setup() if setup is not None else None)
    times = []
    for _ in range(max(1, repeat)):
        arg = setup() if setup is not None else None
        t0 = _time.perf_counter()
        result = fn(arg)
        times.append(_time.perf_counter() - t0)
        if budget_s is not None and _time.perf_counter() - start > budget_s:
            break
    return min(times), times, result


def _files_under(path: Any) -> list[str]:
    import os as _os

    path = _os.fspath(path)
    if not _os.path.isdir(path):
        return [path]
    found = []
    for root, _dirs, names in _os.walk(path):
        found.extend(_os.path.join(root, name) for name in sorted(names))
    return found


def read_file_chunks(path: Any, chunk_bytes: int = 4 << 20) -> int:
    """Read a whole file with ``os.preadv`` into one reused buffer; returns bytes read."""
    import os as _os

    buf = memoryview(bytearray(chunk_bytes))
    fd = _os.open(path, _os.O_RDONLY)
    try:
        offset = 0
        while (n := _os.preadv(fd, [buf], offset)) > 0:
            offset += n
        return offset
    finally:
        _os.close(fd)


def tree_read_bps(path: Any, repeat: int = 2) -> float:
    """Best bytes/s of ``read_file_chunks`` over every file under ``path``, the page cache
    as it is. Right after a reader's warm rows this is the page-cache read limit of
    *those* files: it depends on how their pages came into the page cache (a file
    written, or read sequentially, sits in large folios; pages brought in by scattered
    or concurrent reads, or ``POSIX_FADV_WILLNEED``, are 4 KiB each and read at about
    half the speed on Linux 6.18 with ext4)."""
    import time as _time

    names = _files_under(path)
    best = float("inf")
    total = 0
    for _ in range(repeat):
        t0 = _time.perf_counter()
        total = sum(read_file_chunks(name) for name in names)
        best = min(best, _time.perf_counter() - t0)
    return total / best


def cold_files_bps(path: Any, random_blocks: int = 0, seed: int = 0) -> float:
    """Bytes/s of a plain cold read of the files under ``path`` (the page cache dropped
    first, see :func:`drop_page_cache`): in name order with 4 MiB ``preadv`` when
    ``random_blocks`` is 0, else that many 1 MiB ``preadv`` (at most every whole 1 MiB
    block there is) at distinct random 1 MiB-aligned offsets of the files, one at a time
    (depth 1): no block twice, so none comes from the page cache.

    The cold rows of ``read.py`` run it on the cache they read, right before each timed
    run: the disk behind a virtual machine swings by 2x within minutes, and a file the
    guest wrote recently may still be in the host's page cache, so a limit measured on
    another file, at another time, says little about these reads."""
    import os as _os
    import random as _random
    import time as _time

    names = _files_under(path)
    drop_page_cache(path)
    if random_blocks == 0:
        t0 = _time.perf_counter()
        total = sum(read_file_chunks(name) for name in names)
        return total / (_time.perf_counter() - t0)
    block = 1 << 20
    blocks = [(name, k * block) for name in names for k in range(_os.path.getsize(name) // block)]
    if not blocks:
        raise ValueError(f"no file of 1 MiB or more under {path}")
    plan = _random.Random(seed).sample(blocks, min(random_blocks, len(blocks)))
    buf = memoryview(bytearray(block))
    fds = {name: _os.open(name, _os.O_RDONLY) for name, _ in plan}
    try:
        t0 = _time.perf_counter()
        total = sum(_os.preadv(fds[name], [buf], offset) for name, offset in plan)
        return total / (_time.perf_counter() - t0)
    finally:
        for fd in fds.values():
            _os.close(fd)


def drop_page_cache(path: Any) -> None:
    """Evict the page cache of a file, or of every file under a directory.

    ``posix_fadvise(DONTNEED)`` only drops clean pages, so each file is fsynced first.
    Pages mapped by a process stay resident: drop before opening what maps them.
    """
    import os as _os

    for name in _files_under(path):
        fd = _os.open(name, _os.O_RDONLY)
        try:
            _os.fsync(fd)
            _os.posix_fadvise(fd, 0, 0, _os.POSIX_FADV_DONTNEED)
        finally:
            _os.close(fd)


def proactive_reclaim(root: str = "/sys/kernel/mm/damon/admin/kdamonds") -> str | None:
    """A description of the DAMON schemes that page memory out proactively on this
    machine (Linux's DAMON sysfs interface, ``root``: the kdamonds directory), or None
    when none runs: such a scheme takes page-cache pages left idle out of memory between
    benchmark rows. Only the first context of each running kdamond is read."""
    import os as _os

    def read(path: str) -> str:
        with open(path) as f:
            return f.read().strip()

    found = []
    try:
        kdamonds = sorted(_os.listdir(root))
    except OSError:
        return None
    for kdamond in kdamonds:
        base = f"{root}/{kdamond}"
        try:
            if read(f"{base}/state") != "on":
                continue
            aggr_us = int(read(f"{base}/contexts/0/monitoring_attrs/intervals/aggr_us"))
            schemes = f"{base}/contexts/0/schemes"
            for scheme in sorted(_os.listdir(schemes)):
                if not scheme.isdigit() or read(f"{schemes}/{scheme}/action") != "pageout":
                    continue
                age = int(read(f"{schemes}/{scheme}/access_pattern/age/min"))
                found.append(f"DAMON pageout of memory idle for {age * aggr_us / 1e6:g} s or more")
        except (OSError, ValueError):
            continue
    return "; ".join(found) or None


def resident_fraction(path: Any) -> float:
    """Fraction of the pages of a file (or directory tree) in the page cache (mincore)."""
    import ctypes as _ct
    import mmap as _mmap
    import os as _os

    libc = _ct.CDLL(None, use_errno=True)
    libc.mmap.restype = _ct.c_void_p
    libc.mmap.argtypes = [_ct.c_void_p, _ct.c_size_t, _ct.c_int, _ct.c_int, _ct.c_int, _ct.c_long]
    libc.munmap.argtypes = [_ct.c_void_p, _ct.c_size_t]
    libc.mincore.argtypes = [_ct.c_void_p, _ct.c_size_t, _ct.c_void_p]
    page = _mmap.PAGESIZE
    resident = total = 0
    for name in _files_under(path):
        size = _os.path.getsize(name)
        if size == 0:
            continue
        pages = (size + page - 1) // page
        fd = _os.open(name, _os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, _mmap.PROT_READ, _mmap.MAP_SHARED, fd, 0)
            if addr in (None, _ct.c_void_p(-1).value):
                raise OSError(_ct.get_errno(), f"mmap {name}")
            try:
                vec = (_ct.c_ubyte * pages)()
                if libc.mincore(addr, size, vec) != 0:
                    raise OSError(_ct.get_errno(), f"mincore {name}")
                resident += sum(b & 1 for b in bytes(vec))
            finally:
                libc.munmap(addr, size)
        finally:
            _os.close(fd)
        total += pages
    return resident / total if total else 0.0


def sample_digest(data: Any) -> bytes:
    """The 16-byte digest a payload is checked by (BLAKE2b-128)."""
    import hashlib as _hashlib

    return _hashlib.blake2b(data, digest_size=16).digest()


class SampleCheck:
    """Checks samples one by one against expected per-sample digests.

    ``digests`` holds 16 bytes per sample id. Every payload must match its sample id's
    digest and every metadata dict must equal ``{"label": id % 10, "split": "train"}``.
    Also hashes the sequence of (digest) in delivery order (``stream``) and of sample ids
    (``ids``), so an ordered pass is checked against the expected stream and a shuffled
    pass can be compared with another implementation's order.
    """

    def __init__(self, digests: bytes, cache_id: int | None = None) -> None:
        import hashlib as _hashlib

        self.digests = digests
        self.cache_id = cache_id
        self.count = 0
        self.bad = 0
        self.first_bad = ""
        self.bytes = 0
        self._stream = _hashlib.sha256()
        self._ids = _hashlib.sha256()
        self._distinct: set[int] = set()

    def add(self, data: Any, metadata: Any, cache_id: int, sample_id: int) -> None:
        digest = sample_digest(data)
        self.count += 1
        self.bytes += len(data)
        self._stream.update(digest)
        self._ids.update(int(sample_id).to_bytes(8, "little"))
        self._distinct.add(int(sample_id))
        problem = ""
        sid = int(sample_id)
        if not 0 <= sid < len(self.digests) // 16:
            problem = f"sample_id {sid} out of range"
        elif digest != self.digests[16 * sid : 16 * sid + 16]:
            problem = f"payload of sample {sid} does not match"
        elif self.cache_id is not None and int(cache_id) != self.cache_id:
            problem = f"cache_id {cache_id} != {self.cache_id}"
        elif metadata is not None and dict(metadata) != {"label": sid % 10, "split": "train"}:
            problem = f"metadata of sample {sid} is {metadata!r}"
        if problem:
            self.bad += 1
            self.first_bad = self.first_bad or problem

    def summary(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "bytes": self.bytes,
            "bad": self.bad,
            "first_bad": self.first_bad,
            "stream": self._stream.hexdigest(),
            "ids": self._ids.hexdigest(),
            "distinct": len(self._distinct),
        }


def expected_stream(digests: bytes, ids: Any) -> tuple[str, str]:
    """(stream hash, ids hash) of ``ids`` delivered in order, as :class:`SampleCheck` computes."""
    import hashlib as _hashlib

    stream = _hashlib.sha256()
    id_hash = _hashlib.sha256()
    for sid in ids:
        stream.update(digests[16 * sid : 16 * sid + 16])
        id_hash.update(int(sid).to_bytes(8, "little"))
    return stream.hexdigest(), id_hash.hexdigest()


PORTABLE: list[Callable[..., Any] | type] = [
    best_of,
    _files_under,
    read_file_chunks,
    tree_read_bps,
    cold_files_bps,
    drop_page_cache,
    resident_fraction,
    sample_digest,
    SampleCheck,
    expected_stream,
]


def portable_source(extra: Sequence[Callable[..., Any] | type] = ()) -> str:
    """Source of the portable helpers (plus ``extra``) to prepend to a reference script."""
    import inspect

    header = "from typing import Any, Callable\n\n"
    return header + "\n\n".join(inspect.getsource(obj) for obj in [*PORTABLE, *extra])


# ------------------------------------------------------------------ machine limits


def write_random_file(path: Path, size_bytes: int, seed: int = 0) -> None:
    """A file of ``size_bytes`` pseudo-random bytes, fsynced."""
    rng = random.Random(seed)
    block = rng.randbytes(CHUNK_BYTES)
    with open(path, "wb") as handle:
        written = 0
        while written < size_bytes:
            piece = block[: min(CHUNK_BYTES, size_bytes - written)]
            handle.write(piece)
            written += len(piece)
        handle.flush()
        os.fsync(handle.fileno())


def python_ordered_loop(path: Path, record_bytes: int) -> int:
    """The hand-written per-sample floor: 4 MiB ``preadv`` into numpy, one ``bytes`` per record.

    ``path`` holds records of ``record_bytes`` back to back. Returns the records made.
    """
    import numpy as np

    records_per_chunk = max(1, CHUNK_BYTES // record_bytes)
    chunk = np.empty(records_per_chunk * record_bytes, dtype=np.uint8)
    view = memoryview(chunk)
    fd = os.open(path, os.O_RDONLY)
    count = 0
    try:
        offset = 0
        while True:
            n = os.preadv(fd, [view], offset)
            if n <= 0:
                return count
            offset += n
            for start in range(0, n - record_bytes + 1, record_bytes):
                sample = chunk[start : start + record_bytes].tobytes()
                count += len(sample) > 0
    finally:
        os.close(fd)


def python_random_loop(path: Path, record_bytes: int, order: Sequence[int]) -> int:
    """The per-sample random-access floor: one ``os.pread`` per record, in ``order``."""
    fd = os.open(path, os.O_RDONLY)
    count = 0
    try:
        for i in order:
            sample = os.pread(fd, record_bytes, i * record_bytes)
            count += len(sample) > 0
        return count
    finally:
        os.close(fd)


def memcpy_bandwidth(size_bytes: int, repeat: int) -> float:
    """Bytes/s of a numpy copy between two preallocated, pre-touched arrays."""
    import numpy as np

    src = np.ones(size_bytes, dtype=np.uint8)
    dst = np.zeros(size_bytes, dtype=np.uint8)
    best, _, _ = best_of(lambda _: np.copyto(dst, src), repeat)
    return size_bytes / best


def read_into_batches(
    path: Path, threads: int = 2, batch_bytes: int = 64 * MiB, read_bytes: int = MiB
) -> int:
    """Read a warm file with ``os.preadv`` of ``read_bytes`` into batch-sized destinations,
    on ``threads`` threads (read ``k`` on thread ``k % threads``), each thread filling
    its own ``batch_bytes`` buffers one after the other, three in turn (pre-touched):
    where the bytes of W2 ``iter_batches(64)`` must land. A batch that large does not
    stay in the CPU caches, so every byte is also written to memory, which the 4 MiB
    page-cache limit (a reused buffer) never does. Returns the bytes read."""
    import threading

    import numpy as np

    size = path.stat().st_size
    reads = [(offset, min(read_bytes, size - offset)) for offset in range(0, size, read_bytes)]
    buffers = [[np.ones(batch_bytes, dtype=np.uint8) for _ in range(3)] for _ in range(threads)]
    fd = os.open(path, os.O_RDONLY)

    def work(k: int) -> None:
        at = turn = 0
        for offset, n in reads[k::threads]:
            if at + n > batch_bytes:
                at, turn = 0, (turn + 1) % 3
            os.preadv(fd, [memoryview(buffers[k][turn])[at : at + n]], offset)
            at += n

    try:
        workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        os.close(fd)
    return size


def write_file_fsync(path: Path, size_bytes: int, block: bytes) -> int:
    """Create ``path``, write ``size_bytes`` with one ``os.write`` per ``len(block)``
    chunk, then ``fsync`` and close; returns the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(block)
        written = 0
        while written < size_bytes:
            piece = view[: min(len(view), size_bytes - written)]
            while len(piece):
                n = os.write(fd, piece)
                written += n
                piece = piece[n:]
        os.fsync(fd)
        return written
    finally:
        os.close(fd)


def write_fsync_bandwidth(
    path: Path,
    size_bytes: int,
    repeat: int,
    chunk_bytes: int = CHUNK_BYTES,
    budget_s: float | None = None,
) -> tuple[float, list[float]]:
    """Bytes/s of a plain sequential write of a new ``size_bytes`` file + ``fsync``.

    Chunks of ``chunk_bytes`` pseudo-random bytes (generated once, untimed). Before every
    run (untimed) the previous file is removed and ``os.sync()`` settles the filesystem;
    the file is removed at the end. Returns (best bytes/s, every run's seconds).
    """
    block = random.Random(3).randbytes(chunk_bytes)

    def fresh() -> None:
        path.unlink(missing_ok=True)
        os.sync()

    try:
        best, times, _ = best_of(
            lambda _: write_file_fsync(path, size_bytes, block),
            repeat,
            warmup=0,
            setup=fresh,
            budget_s=budget_s,
        )
    finally:
        path.unlink(missing_ok=True)
    return size_bytes / best, times


def measure_limits(
    workdir: Path,
    file_bytes: int,
    repeat: int,
    record_file: Path | None = None,
    record_bytes: int = 512,
    random_records: int = 200_000,
    cold: bool = True,
) -> dict[str, float]:
    """The machine's limits, in bytes/s (``*_bps``) and records/s (``*_rps``); with
    ``cold=False`` only the warm ones (the page cache, memcpy and the Python loops).

    - ``pagecache_bps``: a warm ``file_bytes`` file read with 4 MiB ``preadv``.
    - ``pagecache_batches_bps``: the same file read into 64 MiB batches on 2 threads
      (:func:`read_into_batches`).
    - ``memcpy_bps``: numpy copy of a 256 MiB array.
    - ``cold_seq_bps``: the same file after ``posix_fadvise(DONTNEED)``, 4 MiB reads.
    - ``cold_rand_bps``: 1 MiB reads at random 1 MiB-aligned offsets, depth 1, cold.
    - ``py_ordered_rps`` / ``py_random_rps`` (when ``record_file`` is given): the pure
      Python per-sample loops over ``record_file`` (ordered 4 MiB reads sliced into
      ``bytes``; one ``os.pread`` per record in a random order).
    """
    path = workdir / "limits.bin"
    if not path.exists() or path.stat().st_size != file_bytes:
        write_random_file(path, file_bytes)
    limits: dict[str, float] = {}

    best, _, _ = best_of(lambda _: read_file_chunks(path), repeat)
    limits["pagecache_bps"] = file_bytes / best
    best, _, _ = best_of(lambda _: read_into_batches(path), repeat)
    limits["pagecache_batches_bps"] = file_bytes / best
    limits["memcpy_bps"] = memcpy_bandwidth(256 * MiB, repeat)
    if not cold:
        return limits | _python_loop_limits(record_file, record_bytes, random_records, repeat)

    limits["cold_seq_bps"] = max(cold_files_bps(path) for _ in range(repeat))
    limits["cold_rand_bps"] = max(
        cold_files_bps(path, COLD_RANDOM_READS, seed=k) for k in range(repeat)
    )
    drop_page_cache(path)
    limits["cold_resident_after_drop"] = resident_fraction(path)
    return limits | _python_loop_limits(record_file, record_bytes, random_records, repeat)


def _python_loop_limits(
    record_file: Path | None, record_bytes: int, random_records: int, repeat: int
) -> dict[str, float]:
    """``py_ordered_rps`` and ``py_random_rps`` of :func:`measure_limits` (none without a
    ``record_file``)."""
    if record_file is None:
        return {}
    records = record_file.stat().st_size // record_bytes
    best, _, _ = best_of(lambda _: python_ordered_loop(record_file, record_bytes), repeat)
    order = list(range(records))
    random.Random(2).shuffle(order)
    order = order[:random_records]
    best_random, _, _ = best_of(
        lambda _: python_random_loop(record_file, record_bytes, order), repeat
    )
    return {"py_ordered_rps": records / best, "py_random_rps": len(order) / best_random}


# ------------------------------------------------------------------ machine facts


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _filesystem_of(path: Path) -> str:
    best = ("", "?", "?")
    with contextlib.suppress(OSError):
        target = os.path.realpath(path)
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            inside = target == mount or target.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best[0]):
                best = (mount, fstype, device)
    return f"{best[1]} on {best[2]}"


def build_mode() -> str:
    """How the loaded library was built, as far as can be told.

    The build hook reads ``DATASET_RT_ZIG_OPTIMIZE`` / ``DATASET_RT_ZIG_CPU`` (defaults
    ReleaseSafe / baseline) when uv rebuilds; the library does not report its build
    mode, so the safety-check panic strings present in ReleaseSafe/Debug builds are
    looked for in the .so as a cross-check.
    """
    optimize = os.environ.get("DATASET_RT_ZIG_OPTIMIZE")
    cpu = os.environ.get("DATASET_RT_ZIG_CPU")
    mode = f"optimize={optimize or 'ReleaseSafe'}, cpu={cpu or 'baseline'}"
    source = "from DATASET_RT_ZIG_* env" if optimize or cpu else "defaults; DATASET_RT_ZIG_* unset"
    safety = "?"
    with contextlib.suppress(Exception):
        from dataset_rt import _native

        blob = Path(_native.library_path()).read_bytes()
        safety = "present" if b"integer overflow" in blob else "absent (ReleaseFast/Small?)"
    return f"{mode} ({source}; safety checks in .so: {safety})"


def machine_facts(workdir: Path) -> list[tuple[str, str]]:
    """Facts printed in a benchmark's header."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 0
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory = f"{pages / 2**30:.1f} GiB"
    except (ValueError, OSError):
        memory = "?"
    facts = [
        ("date", time.strftime("%Y-%m-%d %H:%M:%S %Z")),
        ("cpu", f"{os.cpu_count()} logical ({affinity} usable), {_cpu_model()}"),
        ("memory", memory),
        ("kernel", f"{platform.system()} {platform.release()}"),
        ("python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("workdir", f"{workdir} ({_filesystem_of(workdir)})"),
    ]
    with contextlib.suppress(Exception):
        from dataset_rt import _native

        version = _native.ffi.string(_native.lib.drt_version()).decode()
        facts.append(("dataset_rt", f"{version}, {_native.library_path()}"))
    facts.append(("build", build_mode()))
    return facts


# ------------------------------------------------------------------ table


def fmt_num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def fmt_rate(samples_per_s: float | None) -> str:
    """Samples/s, compact: 482k, 1.25M."""
    if samples_per_s is None:
        return "-"
    if samples_per_s >= 1e6:
        return f"{samples_per_s / 1e6:.2f}M"
    if samples_per_s >= 1e3:
        return f"{samples_per_s / 1e3:.1f}k"
    return f"{samples_per_s:.0f}"


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]
) -> None:
    """A GitHub-flavoured Markdown table, padded to line up in a terminal."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)
        ]
        return "| " + " | ".join(parts) + " |"

    print(line(headers))
    print(
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if r else ("-" * (w + 2))
            for w, r in zip(widths, right, strict=True)
        )
        + "|"
    )
    for row in rows:
        print(line(row))


def pin_library(workdir: Path) -> str | None:
    """Load a private copy of the native library for the whole run; returns what was done.

    Other checkouts' builds may rewrite ``dataset_rt/libdataset_rt.so`` in place while a
    benchmark runs, which kills a process that has it mapped (SIGBUS). The copy is made
    before ``dataset_rt`` is imported and loaded through the developer override
    ``DATASET_RT_LIBRARY`` (left alone when already set), which subprocesses inherit.
    """
    import importlib.util

    if os.environ.get("DATASET_RT_LIBRARY"):
        return None
    found = importlib.util.find_spec("dataset_rt")
    if found is None or found.origin is None:
        return None
    built = Path(found.origin).with_name("libdataset_rt.so")
    if not built.exists():
        return None
    pinned = workdir / "libdataset_rt.so"
    shutil.copy2(built, pinned)
    os.environ["DATASET_RT_LIBRARY"] = str(pinned)
    return f"{built} copied to {pinned}"


def bench_parser(
    description: str,
    *,
    quick_help: str,
    workdir_help: str,
    repeat_help: str = "timed runs per configuration (default 3; --quick 1)",
    only_help: str = "run configurations whose label contains this",
) -> argparse.ArgumentParser:
    """The options every benchmark script has: --quick, --no-reference, --workdir,
    --repeat, --only and --json."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--no-reference", action="store_true", help="skip dataset-rt 0.4.8")
    parser.add_argument("--workdir", type=Path, help=workdir_help)
    parser.add_argument("--repeat", type=int, help=repeat_help)
    parser.add_argument("--only", default="", help=only_help)
    parser.add_argument("--json", type=Path, help="also write all results to this file")
    return parser


@contextlib.contextmanager
def bench_workdir(
    given: Path | None, name: str, scratch: Sequence[str] = ()
) -> Iterator[tuple[Path, str | None]]:
    """``(workdir, pinned library note)``: ``given`` (kept afterwards, except its
    ``scratch`` subdirectories) or a temporary directory removed afterwards; the native
    library is pinned into it for the run (:func:`pin_library`)."""
    workdir = given or Path(tempfile.mkdtemp(prefix=f"dataset_rt-bench-{name}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        yield workdir, pin_library(workdir)
    finally:
        for sub in scratch:
            shutil.rmtree(workdir / sub, ignore_errors=True)
        if given is None:
            shutil.rmtree(workdir, ignore_errors=True)


def print_header(title: str, quick: bool, workdir: Path, pinned: str | None) -> None:
    """The report's first lines: title, machine facts, the pinned library, the load."""
    print(f"# dataset_rt {title} benchmark" + (" (--quick)" if quick else ""))
    for name, value in machine_facts(workdir):
        print(f"- {name}: {value}")
    if pinned:
        print(f"- native library pinned for the run: {pinned}")
    print(f"- load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


# ------------------------------------------------------------------ reference release


class Reference:
    """dataset-rt 0.4.8 in its own virtualenv: the one the tests build and share
    (``tests/refenv.py``: stdlib ``venv`` + pip, locked, reused; ``DATASET_RT_REF_VENV``
    overrides its path). Scripts run isolated (``python -I``, no ``PYTHONPATH``, a fresh
    working directory) after a prelude proving they import the release."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.python = env.python

    def run_json(self, script: str, args: Sequence[str] = (), timeout: float = 1800.0) -> Any:
        """Run ``script`` in the reference's interpreter; parse the last stdout line as JSON."""
        # Annotations in the shipped helpers stay unevaluated on any Python version.
        source = "from __future__ import annotations\n" + script
        proc = self.env.run(source, *map(str, args), timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(
                f"reference script failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
            )
        lines = [x for x in proc.stdout.splitlines() if x.strip()]
        if not lines:
            raise RuntimeError(f"reference script printed nothing:\n{proc.stderr[-4000:]}")
        return json.loads(lines[-1])


def get_reference(enabled: bool) -> Reference | None:
    """The reference, or None after printing why it is not available."""
    if not enabled:
        print("reference: not available (disabled by --no-reference)")
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import refenv

    try:
        return Reference(refenv.ensure_reference())
    except (refenv.ReferenceUnavailable, refenv.ReferenceSetupError) as exc:
        print(f"reference: not available ({exc})")
        return None


__all__ = [
    "CHUNK_BYTES",
    "DIGEST_BYTES",
    "MiB",
    "Reference",
    "SampleCheck",
    "bench_parser",
    "bench_workdir",
    "best_of",
    "drop_page_cache",
    "expected_stream",
    "fmt_num",
    "fmt_rate",
    "get_reference",
    "machine_facts",
    "measure_limits",
    "pin_library",
    "portable_source",
    "print_header",
    "print_table",
    "resident_fraction",
    "sample_digest",
]
