"""The read-ahead byte budget (``ReaderConfig.prefetch_bytes``): large records read with a
tight budget hold memory within it, and no configuration changes what is read.

Every configuration (I/O backend, ``prefetch_size``, byte budget, per-sample or
``iter_batches`` of several sizes, ordered or shuffled, compressed or not) must return the
same samples in the same order as the default configuration.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import dataset_rt as drt

ROOT = Path(__file__).resolve().parents[1]

SAMPLES = 60


class _Mixed:
    """Records from a few bytes to 600 KiB (several larger than the tight budgets below)."""

    name = "mixed"

    def __iter__(self) -> Any:
        for i in range(SAMPLES):
            size = (i * 37 % 13) * 50_000 + i
            yield drt.CacheInput(bytes([i % 251]) * size, {"i": i, "tag": f"t{i % 3}"})


@pytest.fixture(scope="module", params=["none", "lz4"])
def mixed_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp(f"budget-{request.param}")
    rt = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(
        show_progress=False,
        max_shard_bytes=2_000_000,  # several shards: coalesced reads end at shard ends
        shard_compression=drt.ShardCompression(algo=request.param),
    )
    [result] = rt.write_cache(_Mixed(), base, writer_config=config)
    assert type(result).__name__ == "CacheWriteSuccess", result
    return Path(result.path)


def _stream(dataset: Any, mode: int) -> list[tuple[int, int, bytes, dict[str, Any]]]:
    """One epoch as (cache_id, sample_id, payload, metadata): per sample (mode 0) or
    through ``iter_batches(mode)``."""
    if mode == 0:
        return [(s.cache_id, s.sample_id, s.data, s.metadata) for s in dataset]
    out = []
    for batch in dataset.iter_batches(mode):
        assert 1 <= len(batch) <= mode
        rows = batch.metadata.to_dicts()
        for i in range(len(batch)):
            out.append((int(batch.cache_id[i]), int(batch.sample_id[i]), batch.payload(i), rows[i]))
    return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_configuration_reads_the_same_stream(
    runtime, io_backend: str, mixed_cache: Path, shuffle: bool
) -> None:
    def open_dataset(**options: Any) -> Any:
        config = drt.ReaderConfig(seed=5, shuffle=shuffle, io_backend=io_backend, **options)
        return runtime.cached_dataset([mixed_cache], reader_config=config)

    expected = _stream(open_dataset(), 0)
    assert len(expected) == SAMPLES
    if not shuffle:
        assert [sid for _, sid, _, _ in expected] == list(range(SAMPLES))
    for prefetch_size in (1, 3, 64):
        # 1 byte: every read alone, each larger than the budget; 200,000: a few records;
        # 0: the automatic budget.
        for prefetch_bytes in (1, 200_000, 0):
            for mode in (0, 1, 7, 500):
                # A fresh dataset: its first window is the stream `expected` holds.
                dataset = open_dataset(prefetch_size=prefetch_size, prefetch_bytes=prefetch_bytes)
                got = _stream(dataset, mode)
                assert got == expected, (prefetch_size, prefetch_bytes, mode)


@pytest.mark.parametrize("shuffle", [False, True])
def test_auto_backend_reads_the_same_stream(runtime, mixed_cache: Path, shuffle: bool) -> None:
    """``io_backend="auto"`` on io_uring hands the large reads of records in the page cache
    to the thread pool and leaves the rest to the ring: the same samples in the same order
    as the thread pool alone, per sample and in batches. Uncompressed and just written, the
    large records are in the page cache, so (where the kernel has ``cachestat``, 6.5) some
    reads went to the pool."""

    def open_dataset(backend: str, **options: Any) -> Any:
        config = drt.ReaderConfig(seed=5, shuffle=shuffle, io_backend=backend, **options)
        return runtime.cached_dataset([mixed_cache], reader_config=config)

    expected = _stream(open_dataset("threads"), 0)
    for prefetch_size in (1, 64):
        for mode in (0, 7):
            dataset = open_dataset("auto", prefetch_size=prefetch_size)
            assert _stream(dataset, mode) == expected, (prefetch_size, mode)
            kernel = tuple(int(x) for x in platform.release().split(".")[:2])
            if dataset.io_backend == "io_uring" and "budget-none" in str(mixed_cache):
                if kernel >= (6, 5):
                    assert dataset.io_stats["pool_reads"] > 0, dataset.io_stats


def test_prefetch_bytes_validation_and_dumps() -> None:
    with pytest.raises(ValueError):
        drt.ReaderConfig(seed=0, prefetch_bytes=-1)
    # An extension at its default is invisible; a set value is kept.
    assert "prefetch_bytes" not in drt.ReaderConfig(seed=0).model_dump()
    assert drt.ReaderConfig(seed=0, prefetch_bytes=4096).model_dump()["prefetch_bytes"] == 4096


BOUND = textwrap.dedent("""
    import sys
    import dataset_rt as drt

    def anon_mib():
        # Anonymous memory only: buffers, rings, arenas. File-backed pages (code pages
        # of pyarrow and Polars loaded on their first use, which differ by CPU and
        # build; shard mappings, bounded separately in test_mapped_budget.py) are not
        # what prefetch_bytes bounds.
        with open("/proc/self/status") as status:
            line = [x for x in status if x.startswith("RssAnon:")][0]
        return int(line.split()[1]) / 1024

    path, backend, budget, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    validate = bool(int(sys.argv[6]))
    if int(sys.argv[5]):
        # Per-sample reads of large records into the bytes handed out read only
        # PAYLOAD_AHEAD_BYTES ahead, whatever the budget: off, they read ahead as
        # far as the budget lets them.
        drt.dataset.PAYLOAD_BUFFER_BYTES = 1 << 62
    rt = drt.DatasetRuntime(num_workers=2)
    ds = rt.cached_dataset([path], reader_config=drt.ReaderConfig(
        seed=0, shuffle=False, prefetch_size=64, prefetch_bytes=budget, io_backend=backend,
        validate_cache=validate))
    if batches:
        import numpy, polars  # their import is not the reader's memory
        polars.DataFrame({"x": numpy.zeros(3)})
    before = peak = anon_mib()
    # Sampled after every step, while the step's sample or batch is alive: the
    # prefetch ring and the batch arena persist between steps, so their peak is seen.
    if batches:
        for i, batch in enumerate(ds.iter_batches(1, copy=False)):
            assert len(batch.data) == 2 << 20 and batch.data[0] == i
            peak = max(peak, anon_mib())
    else:
        for i, sample in enumerate(ds):
            assert sample.data[:1] == bytes([i]) and len(sample.data) == 2 << 20
            peak = max(peak, anon_mib())
    print(peak - before)
""")


class _Big:
    name = "big"

    def __iter__(self) -> Any:
        for i in range(64):
            yield drt.CacheInput(bytes([i]) * (2 << 20), {"i": i})


@pytest.fixture(scope="module")
def big_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 records of 2 MiB in one shard (written here: the writer's own memory is not
    part of the measurement)."""
    base = tmp_path_factory.mktemp("budget-big")
    rt = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(show_progress=False, max_shard_bytes=256 << 20)
    [result] = rt.write_cache(_Big(), base, writer_config=config)
    assert type(result).__name__ == "CacheWriteSuccess", result
    return Path(result.path)


def _growth_mib(
    path: Path,
    backend: str,
    budget: int,
    batches: bool,
    payload_buffers: bool = True,
    validate: bool = False,
) -> float:
    """Peak growth of anonymous memory (MiB) of a fresh interpreter while it reads one
    epoch of ``path``, sampled after every sample or batch (per sample: with or without
    ``payload_buffers``, see ``dataset.PAYLOAD_BUFFER_BYTES``; ``validate``: the reader's
    ``validate_cache``, with which batches read every record through the slots)."""
    args = [
        str(path),
        backend,
        str(budget),
        str(int(batches)),
        str(int(not payload_buffers)),
        str(int(validate)),
    ]
    result = subprocess.run(
        [sys.executable, "-c", BOUND, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    return float(result.stdout.strip())


@pytest.mark.parametrize("batches", [False, True])
def test_tight_byte_budget_bounds_memory(big_cache: Path, io_backend: str, batches: bool) -> None:
    """64 records of 2 MiB with prefetch_size=64: a 4 MiB budget keeps a few MiB in
    memory; a budget of 1 GiB (bounded by prefetch_size only, as before the budget) holds
    far more, so the measurement can tell them apart."""
    tight = _growth_mib(big_cache, io_backend, 4 << 20, batches)
    # The ring (4 MiB), one sample or batch in Python (2 MiB), allocator slack: about
    # 6 MiB per-sample and 8 MiB with batches (the batch buffer, and the first batch's).
    bound = 16
    assert tight < bound, f"peak RSS grew by {tight:.0f} MiB with a 4 MiB budget"
    if batches:
        # Large records of a warm cache are read straight into the batch's buffer, one
        # batch at a time: nothing is read ahead, whatever the budget. Through the slots
        # (validate_cache), the budget bounds the read-ahead.
        assert _growth_mib(big_cache, io_backend, 1 << 30, batches) < bound
        tight = _growth_mib(big_cache, io_backend, 4 << 20, batches, validate=True)
        assert tight < bound, f"peak RSS grew by {tight:.0f} MiB with a 4 MiB budget"
    else:
        # Without the bytes handed out as read buffers, too (the slots' ring).
        assert _growth_mib(big_cache, io_backend, 4 << 20, batches, False) < bound
    # Read-ahead bounded by the budget alone (through the ring).
    loose = _growth_mib(big_cache, io_backend, 1 << 30, batches, False, validate=batches)
    assert loose > tight + 32, (tight, loose)


@pytest.fixture(scope="module")
def lz4_big_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``big_cache`` written with lz4: each 2 MiB record is stored in about 8 KiB, so the
    stored bytes the ring holds say nothing of what they decompress to."""
    base = tmp_path_factory.mktemp("budget-lz4")
    rt = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(
        show_progress=False,
        max_shard_bytes=256 << 20,
        shard_compression=drt.ShardCompression(algo="lz4"),
    )
    [result] = rt.write_cache(_Big(), base, writer_config=config)
    assert type(result).__name__ == "CacheWriteSuccess", result
    return Path(result.path)


@pytest.mark.parametrize("batches", [False, True])
@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_byte_budget_counts_decompressed_payloads(
    lz4_big_cache: Path, io_backend: str, batches: bool, validate: bool
) -> None:
    """Decompressed lz4 payloads count in the byte budget: with prefetch_size=64 and a
    4 MiB budget, 2 MiB records stored in 8 KiB are not all decompressed ahead (they
    were: the budget counted stored bytes, and the slots kept what they decompressed)."""
    tight = _growth_mib(lz4_big_cache, io_backend, 4 << 20, batches, False, validate=validate)
    assert tight < 24, f"peak RSS grew by {tight:.0f} MiB with a 4 MiB budget"


def test_a_budget_of_many_gib_reserves_no_memory(tmp_path: Path) -> None:
    """prefetch_bytes is an upper bound: a budget larger than the machine's memory reads
    (the ring's address space is reserved as far as the system allows, and its pages
    stay within the bytes in flight), instead of failing with MemoryError."""

    class Mid:
        name = "mid"

        def __iter__(self) -> Any:
            for i in range(400):
                yield drt.CacheInput(bytes([i % 251]) * 20_000, {"i": i})

    rt = drt.DatasetRuntime(num_workers=2)
    [result] = rt.write_cache(Mid(), tmp_path, writer_config=drt.WriterConfig(show_progress=False))
    for shuffle in (False, True):
        streams = []
        for budget in (0, 1 << 50):
            config = drt.ReaderConfig(seed=0, shuffle=shuffle, prefetch_bytes=budget)
            dataset = rt.cached_dataset([result.path], reader_config=config)
            streams.append([(s.sample_id, s.data) for s in dataset])
        assert streams[0] == streams[1] and len(streams[0]) == 400
