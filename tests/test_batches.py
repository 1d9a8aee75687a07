"""The batch API yields the same stream as per-sample iteration."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import dataset_rt as drt
from tests.conftest import FIXTURES


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [1, 7, 64, 1000])
def test_batches_match_samples(runtime, io_backend: str, shuffle: bool, batch_size: int) -> None:
    config = drt.ReaderConfig(seed=5, shuffle=shuffle, prefetch_size=16, io_backend=io_backend)
    paths = [FIXTURES / "lz4_many_shards", FIXTURES / "plain_many_shards"]
    first = runtime.cached_dataset(paths, reader_config=config)
    second = runtime.cached_dataset(paths, reader_config=config)
    samples = list(first) + list(first)
    windows = [list(second.iter_batches(batch_size)) for _ in range(2)]
    batches = windows[0] + windows[1]
    assert sum(len(b) for b in batches) == len(samples) == 1200
    flat = [(b, i) for b in batches for i in range(len(b))]
    for sample, (batch, i) in zip(samples, flat):
        assert batch.payload(i) == sample.data
        assert (int(batch.cache_id[i]), int(batch.sample_id[i])) == (
            sample.cache_id,
            sample.sample_id,
        )
        assert batch.metadata.row(i, named=True) == sample.metadata
    for window in windows:
        assert all(len(b) == batch_size for b in window[:-1])
        assert 1 <= len(window[-1]) <= batch_size
    assert isinstance(batches[0].metadata, pl.DataFrame)


def test_zero_copy_batches_match_while_current(runtime, io_backend: str) -> None:
    config = drt.ReaderConfig(seed=1, shuffle=True, io_backend=io_backend)
    paths = [FIXTURES / "plain_many_shards"]
    expected = [(s.sample_id, s.data) for s in runtime.cached_dataset(paths, reader_config=config)]
    got = []
    for batch in runtime.cached_dataset(paths, reader_config=config).iter_batches(64, copy=False):
        got += [(int(batch.sample_id[i]), batch.payload(i)) for i in range(len(batch))]
    assert got == expected


# ------------------------------------------------------- iter_batches(copy=True) memory


class _Large:
    """W2-like records (around 200 KiB, varying: batches outgrow the memory the previous
    batch foresaw) with int, float, bool and string metadata."""

    name = "large"

    def __init__(self, count: int = 120) -> None:
        self.count = count

    def __iter__(self):
        for i in range(self.count):
            size = 150_000 + (i * 7919 % 23) * 9_000 + (300_000 if i % 29 == 5 else 0)
            data = (i.to_bytes(4, "little") + bytes(range(256)) * (size // 256 + 1))[:size]
            meta = {"i": i, "x": i / 7, "even": i % 2 == 0, "tag": f"t{i % 5}" * (i % 3)}
            yield drt.CacheInput(data, meta)


@pytest.fixture(scope="module")
def large_cache(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("large")
    rt = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(
        show_progress=False,
        max_shard_bytes=8_000_000,
        shard_compression=drt.ShardCompression(algo="none"),
    )
    [result] = rt.write_cache(_Large(), base, writer_config=config)
    assert type(result).__name__ == "CacheWriteSuccess", result
    return result.path


def _rows(batch) -> list[tuple]:
    rows = batch.metadata.to_dicts()
    assert int(batch.offsets[-1]) == len(batch.data)
    return [
        (int(batch.cache_id[i]), int(batch.sample_id[i]), batch.payload(i), rows[i])
        for i in range(len(batch))
    ]


@pytest.fixture(params=["pool", "fresh"])
def batch_memory(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """iter_batches(copy=True) memory: the pool for every batch (the test caches' batches
    are smaller than the pool's threshold), or fresh memory as for small batches."""
    from dataset_rt import dataset as dataset_module

    if request.param == "pool":
        monkeypatch.setattr(dataset_module, "_POOL_BATCH_MIN_BYTES", 0)
    return request.param


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [1, 5, 64])
def test_large_record_batches_match_samples(
    runtime, io_backend: str, large_cache, shuffle: bool, batch_size: int, batch_memory: str
) -> None:
    """Large records take the gathering path (payloads copied once into the batch's
    memory): the same bytes, identities, metadata and batch boundaries as per-sample
    reads and as zero-copy batches, with a default and a tight read-ahead budget."""
    for budget in (0, 1_000_000):
        config = drt.ReaderConfig(
            seed=3, shuffle=shuffle, io_backend=io_backend, prefetch_bytes=budget
        )
        expected = [
            (s.cache_id, s.sample_id, s.data, s.metadata)
            for s in runtime.cached_dataset([large_cache], reader_config=config)
        ]
        zero_copy = []
        sizes = []
        dataset = runtime.cached_dataset([large_cache], reader_config=config)
        for batch in dataset.iter_batches(batch_size, copy=False):
            zero_copy += _rows(batch)
            sizes.append(len(batch))
        copied = []
        dataset = runtime.cached_dataset([large_cache], reader_config=config)
        batches = list(dataset.iter_batches(batch_size))  # every batch kept
        for batch in batches:
            assert batch.data.flags.writeable and batch.data.dtype.name == "uint8"
            copied += _rows(batch)
        assert [len(b) for b in batches] == sizes
        assert copied == expected
        assert zero_copy == expected


def _pool_of(batch):
    """The array a batch's payloads live in (a pool's, or the batch's own)."""
    array = batch.data
    while array.base is not None:
        array = array.base.obj if isinstance(array.base, memoryview) else array.base
    return array


def test_batch_memory_is_reused_and_bounded(runtime, large_cache, monkeypatch) -> None:
    """A consumer that drops each batch gets the same reused memory every time; one that
    keeps every batch gets fresh memory once the pool is full (never a larger pool), and
    every kept batch still holds its own bytes."""
    from dataset_rt import dataset as dataset_module

    monkeypatch.setattr(dataset_module, "_POOL_BATCH_MIN_BYTES", 0)
    config = drt.ReaderConfig(seed=0, shuffle=False)
    expected = [
        (s.cache_id, s.sample_id, s.data, s.metadata)
        for s in runtime.cached_dataset([large_cache], reader_config=config)
    ]
    dataset = runtime.cached_dataset([large_cache], reader_config=config)
    homes = set()
    got = []
    for batch in dataset.iter_batches(8):
        got += _rows(batch)
        homes.add(id(_pool_of(batch)))
    assert got == expected
    assert len(homes) <= 2  # one pool (re-made at most once, as records grow)

    dataset = runtime.cached_dataset([large_cache], reader_config=config)
    kept = list(dataset.iter_batches(8))
    arrays = [_pool_of(b) for b in kept]
    pools = {id(a): a for a in arrays if a.nbytes > kept[0].data.nbytes * 2}
    batch_bytes = max(len(b.data) for b in kept)
    for pool in pools.values():
        assert pool.nbytes <= max(
            dataset_module._POOL_MIN_BYTES,
            2 * dataset_module._POOL_BATCHES * (batch_bytes + dataset_module._GATHER_MARGIN) * 2,
        )
    fresh = [a for a in arrays if a.nbytes < 2 * batch_bytes]
    assert len(fresh) >= len(kept) - 2 * dataset_module._POOL_BATCHES  # the pool ran out
    assert [row for b in kept for row in _rows(b)] == expected


def test_batch_views_outlive_their_batch(runtime, large_cache, monkeypatch) -> None:
    """A view of a batch's ``data`` (numpy collapses views onto the owner of the memory)
    keeps the batch's memory from being reused after the batch itself is dropped."""
    from dataset_rt import dataset as dataset_module

    monkeypatch.setattr(dataset_module, "_POOL_BATCH_MIN_BYTES", 0)
    config = drt.ReaderConfig(seed=0, shuffle=True)
    expected = [s.data for s in runtime.cached_dataset([large_cache], reader_config=config)]
    dataset = runtime.cached_dataset([large_cache], reader_config=config)
    views = []
    for batch in dataset.iter_batches(4):
        offsets = [int(o) for o in batch.offsets]
        views += [batch.data[a:b][::1] for a, b in pairwise(offsets)]
        del batch
    assert [v.tobytes() for v in views] == expected


def _until_error(items) -> tuple[list, str | None]:
    got: list = []
    try:
        for item in items:
            got += item
    except Exception as exc:  # the error ends the stream, as per sample
        return got, f"{type(exc).__name__}: {exc}"
    return got, None


@pytest.mark.parametrize("batch_size", [5, 64])
def test_large_record_batches_stop_at_a_bad_record(
    runtime, io_backend: str, tmp_path, batch_size: int, monkeypatch
) -> None:
    """A record that cannot be decoded in the middle of a batch of large records: the
    samples before it come in a shorter batch, then the per-sample path's error, for
    gathered batches (in the pool or fresh memory) as for zero-copy ones."""
    from dataset_rt import dataset as dataset_module

    config = drt.WriterConfig(
        show_progress=False,
        max_shard_bytes=8_000_000,
        shard_compression=drt.ShardCompression(algo="lz4"),
    )
    [result] = runtime.write_cache(_Large(60), tmp_path, writer_config=config)
    shard = sorted((Path(result.path) / "shards").iterdir())[0]
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    shard.write_bytes(bytes(data))
    reader = drt.ReaderConfig(seed=0, shuffle=False, io_backend=io_backend)

    def samples():
        for s in runtime.cached_dataset([result.path], reader_config=reader):
            yield [(s.cache_id, s.sample_id, s.data, s.metadata)]

    expected, error = _until_error(samples())
    assert error is not None and 0 < len(expected) < 60
    for pool in (True, False):
        if pool:
            monkeypatch.setattr(dataset_module, "_POOL_BATCH_MIN_BYTES", 0)
        for copy in (True, False):
            sizes = []

            def batches(copy=copy, sizes=sizes):
                dataset = runtime.cached_dataset([result.path], reader_config=reader)
                for batch in dataset.iter_batches(batch_size, copy=copy):
                    sizes.append(len(batch))
                    yield _rows(batch)

            got, got_error = _until_error(batches())
            assert (got, got_error) == (expected, error), (pool, copy)
            assert all(size == batch_size for size in sizes[:-1])


def test_batch_pool_releases_in_ring_order_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads taking batch memory at once register their releases in the order of
    their ring positions: dropping the later batch first gives nothing back while the
    earlier one lives (a thread registering late let the pool hand out a live batch's
    bytes to a third batch)."""
    import gc
    import threading
    import time

    from dataset_rt import _buffers

    size = 1 << 20
    pool = _buffers.Pool(3 * size)
    original = _buffers.Releases.view
    b_started = threading.Event()

    def slow_view(self: Any, *args: Any) -> Any:
        if threading.current_thread().name == "A":
            b_started.wait(5)
            time.sleep(0.2)  # B's take runs here unless the pool lock keeps it out
        return original(self, *args)

    monkeypatch.setattr(_buffers.Releases, "view", slow_view)
    got: dict[str, Any] = {}

    def take(name: str) -> None:
        if name == "B":
            b_started.set()
        got[name] = pool.take(size)

    a = threading.Thread(target=take, args=("A",), name="A")
    b = threading.Thread(target=take, args=("B",), name="B")
    a.start()
    b.start()
    a.join(10)
    b.join(10)
    first, second = sorted((got["A"], got["B"]), key=lambda taken: taken[2])
    first[0][:] = 0xAA
    got.clear()
    del second
    gc.collect()  # the later batch is dropped, the earlier one kept
    assert pool.consumed == 0
    third = pool.take(size)
    assert third is not None
    third[0][:] = 0xDD
    assert (first[0] == 0xAA).all()
