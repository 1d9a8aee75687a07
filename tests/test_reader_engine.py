"""The read pipeline: which backend does the reads, bounded memory, cancellation, sampling."""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dataset_rt as drt
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]


def _resident_pages(path: Path) -> int:
    """Pages of the files under ``path`` that are in the page cache (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    resident = 0
    for name in sorted(p for p in path.rglob("*") if p.is_file() and p.stat().st_size > 0):
        size = name.stat().st_size
        fd = os.open(name, os.O_RDONLY)
        try:
            address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
            vec = (ctypes.c_ubyte * ((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
            try:
                assert libc.mincore(address, size, vec) == 0, os.strerror(ctypes.get_errno())
            finally:
                libc.munmap(address, size)
            resident += sum(v & 1 for v in vec)
        finally:
            os.close(fd)
    return resident


def cold_copy(source: Path, target: Path) -> Path:
    """A copy of a cache whose shards are not in the page cache (fsync, then
    ``POSIX_FADV_DONTNEED``); skips where the page cache cannot be dropped (tmpfs)."""
    shutil.copytree(source, target)
    for name in (target / "shards").iterdir():
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if _resident_pages(target / "shards") > 0:
        pytest.skip("the page cache cannot be dropped here (tmpfs?)")
    return target


def test_io_uring_really_reads(runtime, io_backend: str, tmp_path: Path) -> None:
    """Records not in the page cache are read through the backend asked for."""
    dataset = runtime.cached_dataset(
        [cold_copy(FIXTURES / "plain_many_shards", tmp_path / "cold")],
        reader_config=drt.ReaderConfig(seed=0, io_backend=io_backend),
    )
    assert dataset.io_backend == io_backend
    assert sum(len(s.data) for s in dataset) > 0
    stats = dataset.io_stats
    reads = stats["uring_reads"] if io_backend == "io_uring" else stats["pool_reads"]
    other = stats["pool_reads"] if io_backend == "io_uring" else stats["uring_reads"]
    assert reads >= 300 and other == 0  # shuffled: one read per sample
    assert stats["bytes_read"] > 0 and stats["lookup_reads"] == 0
    dataset.get_item(next(iter(dataset)).cache_id, 0)
    assert dataset.io_stats["lookup_reads"] == 1


@pytest.mark.parametrize("shuffle", [False, True])
def test_resident_small_records_come_from_mappings(
    runtime, io_backend: str, tmp_path: Path, shuffle: bool
) -> None:
    """Small records whose pages are in the page cache are served from shard mappings
    (no read through the backend, bytes still counted), and give exactly the samples,
    in the same order, that reads through the backend give."""
    config = drt.ReaderConfig(seed=5, shuffle=shuffle, prefetch_size=8, io_backend=io_backend)
    cold = runtime.cached_dataset(
        [cold_copy(FIXTURES / "plain_many_shards", tmp_path / "cold")], reader_config=config
    )
    warm_path = tmp_path / "warm"
    shutil.copytree(FIXTURES / "plain_many_shards", warm_path)
    for name in (warm_path / "shards").iterdir():
        name.read_bytes()  # in the page cache now
    warm = runtime.cached_dataset([warm_path], reader_config=config)
    for _ in range(2):  # two windows: each iterator maps the shards anew
        read = [(s.sample_id, s.data, s.metadata) for s in cold]
        mapped = [(s.sample_id, s.data, s.metadata) for s in warm]
        assert mapped == read and len(read) == 300
    stats = warm.io_stats
    assert stats["uring_reads"] == 0 and stats["pool_reads"] == 0
    assert stats["bytes_read"] == cold.io_stats["bytes_read"] > 0
    cold_stats = cold.io_stats
    assert cold_stats["uring_reads"] + cold_stats["pool_reads"] > 0


def test_auto_backend_and_native_info(runtime) -> None:
    info = drt.native_info()
    assert info["abi"].startswith("1.")
    dataset = runtime.cached_dataset(
        [FIXTURES / "text_records_v1"], reader_config=drt.ReaderConfig(seed=0)
    )
    assert dataset.io_backend == ("io_uring" if info["io_uring_available"] else "threads")


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_io_uring_syscalls_under_strace(tmp_path: Path) -> None:
    """Independent of our counters: the kernel sees io_uring_enter, not preads (for
    records not in the page cache; resident small records come from mappings)."""
    if not drt.native_info()["io_uring_available"]:
        pytest.skip("io_uring is not available here")
    script = tmp_path / "read.py"
    cold = cold_copy(FIXTURES / "plain_many_shards", tmp_path / "cold")
    script.write_text(
        textwrap.dedent(f"""
        import dataset_rt as drt
        rt = drt.DatasetRuntime(num_workers=1)
        ds = rt.cached_dataset([{str(cold)!r}],
                               reader_config=drt.ReaderConfig(seed=0, io_backend="io_uring"))
        print(sum(len(s.data) for s in ds))
    """)
    )
    result = subprocess.run(
        [
            "strace",
            "-f",
            "-c",
            "-e",
            "trace=io_uring_enter,io_uring_setup,pread64",
            sys.executable,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    calls = {
        line.split()[-1]: int(line.split()[-2])
        for line in result.stderr.splitlines()
        if line.split() and line.split()[-1] in ("io_uring_enter", "io_uring_setup", "pread64")
    }
    assert calls.get("io_uring_setup", 0) >= 1 and calls.get("io_uring_enter", 0) >= 1, (
        result.stderr
    )
    # 300 records were read; the few preads left are Python's own (imports).
    assert calls.get("pread64", 0) < 20, result.stderr


BOUND = textwrap.dedent("""
    import resource, sys
    import dataset_rt as drt

    class Big:
        name = "big"
        def __iter__(self):
            for i in range(96):
                yield drt.CacheInput(bytes([i]) * (1 << 20), {"i": i})

    base, backend, prefetch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rt = drt.DatasetRuntime(num_workers=2)
    [result] = rt.write_cache(Big(), base, writer_config=drt.WriterConfig(show_progress=False))
    ds = rt.cached_dataset([result.path], reader_config=drt.ReaderConfig(
        seed=0, shuffle=False, prefetch_size=prefetch, io_backend=backend))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for sample in ds:
        assert len(sample.data) == 1 << 20
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((after - before) // 1024)
""")


def test_memory_is_bounded_by_prefetch(tmp_path: Path, io_backend: str) -> None:
    """Reading 96 MiB of 1 MiB records with prefetch_size=4 holds a few MiB, not the data."""
    script = tmp_path / "bound.py"
    script.write_text(BOUND)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "c"), io_backend, "4"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    grown_mib = int(result.stdout.strip())
    assert grown_mib < 32, (
        f"peak RSS grew by {grown_mib} MiB while reading 96 MiB with prefetch_size=4"
    )


def test_break_cancels_and_iterators_run_together(runtime, io_backend: str) -> None:
    config = drt.ReaderConfig(seed=3, shuffle=False, prefetch_size=8, io_backend=io_backend)
    dataset = runtime.cached_dataset([FIXTURES / "plain_many_shards"], reader_config=config)
    dataset.set_epoch_len(50)
    first, second = iter(dataset), iter(dataset)
    a = [next(first).sample_id for _ in range(5)]
    b = [next(second).sample_id for _ in range(5)]
    assert a == [0, 1, 2, 3, 4] and b == [50, 51, 52, 53, 54]
    del first  # abandoned mid-window: reads cancelled, buffers freed, window used up
    assert [s.sample_id for s in second][:3] == [55, 56, 57]
    assert [s.sample_id for s in dataset][:1] == [100]


DESCRIPTORS = textwrap.dedent(
    """
    import os, resource, sys
    import dataset_rt as drt

    base, backend = sys.argv[1], sys.argv[2]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    rt = drt.DatasetRuntime(num_workers=2)

    def shard_fds():
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += "/shards/" in os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                pass
        return n

    peak = 0
    for shuffle in (True, False):
        config = drt.ReaderConfig(seed=1, shuffle=shuffle, prefetch_size=1024, io_backend=backend)
        ds = rt.cached_dataset([f"{base}/many"], reader_config=config)
        ids = []
        for sample in ds:
            peak = max(peak, shard_fds())
            assert sample.data[:4] == sample.sample_id.to_bytes(4, "little")
            assert len(sample.data) == 20_000
            ids.append(sample.sample_id)
        assert len(ids) == 600 and (shuffle or ids == list(range(600))), ids
        ds = rt.cached_dataset([f"{base}/many"], reader_config=config)
        batches = [b.sample_id.tolist() for b in ds.iter_batches(512)]
        assert [i for b in batches for i in b] == ids
        peak = max(peak, shard_fds())
    print(peak)
    """
)


def test_descriptors_stay_bounded_with_many_shards_in_flight(
    tmp_path: Path, io_backend: str
) -> None:
    """600 shards of one 20 kB record each (read through the slots, not mappings) with
    prefetch_size=1024: an iterator keeps at most 64 cached shard descriptors plus 64 of
    reads whose cache entries are busy (plus the few of read-ahead hints), so it reads
    every sample under RLIMIT_NOFILE=256 instead of failing with EMFILE."""

    class Many:
        name = "many"

        def __iter__(self):
            for i in range(600):
                yield drt.CacheInput(i.to_bytes(4, "little") + bytes(19_996), {})

    result = drt.DatasetRuntime(num_workers=2).write_cache(
        Many(),
        tmp_path,
        writer_config=drt.WriterConfig(show_progress=False, max_shard_bytes=20_000),
    )
    assert isinstance(result[0], drt.CacheWriteSuccess), result
    assert len(list((tmp_path / "many" / "shards").iterdir())) == 600
    script = tmp_path / "descriptors.py"
    script.write_text(DESCRIPTORS)
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path), io_backend],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) <= 64 + 64 + 16, result.stdout
