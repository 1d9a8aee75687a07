"""The read pipeline: which backend does the reads, bounded memory, cancellation, sampling."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dataset_rt as drt
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]


def test_io_uring_really_reads(runtime, io_backend: str) -> None:
    dataset = runtime.cached_dataset(
        [FIXTURES / "plain_many_shards"],
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


def test_auto_backend_and_native_info(runtime) -> None:
    info = drt.native_info()
    assert info["abi"].startswith("1.")
    dataset = runtime.cached_dataset(
        [FIXTURES / "text_records_v1"], reader_config=drt.ReaderConfig(seed=0)
    )
    assert dataset.io_backend == ("io_uring" if info["io_uring_available"] else "threads")


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_io_uring_syscalls_under_strace(tmp_path: Path) -> None:
    """Independent of our counters: the kernel sees io_uring_enter, not preads."""
    if not drt.native_info()["io_uring_available"]:
        pytest.skip("io_uring is not available here")
    script = tmp_path / "read.py"
    script.write_text(
        textwrap.dedent(f"""
        import dataset_rt as drt
        rt = drt.DatasetRuntime(num_workers=1)
        ds = rt.cached_dataset([{str(FIXTURES / "plain_many_shards")!r}],
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
