"""Batches built in the caller's memory (``drt_iter_next_batch_into``) and the one-copy
path of ``iter_batches(copy=True)`` that uses it."""

from __future__ import annotations

import numpy as np
import pytest

import dataset_rt as drt
from dataset_rt import _native
from dataset_rt import dataset as dataset_module
from tests.conftest import FIXTURES

_PATHS = [FIXTURES / "lz4_many_shards", FIXTURES / "plain_many_shards"]
_CONTIGUOUS = int(_native.BatchFlag.CONTIGUOUS | _native.BatchFlag.STORED_METADATA)
_STORED = int(_native.BatchFlag.STORED_METADATA)


def _contents(batch: _native.Batch) -> tuple[bytes, list[int], list[int], list[int]]:
    data, offsets, cache_id, sample_id = batch.arrays(True)
    return data.tobytes(), offsets.tolist(), cache_id.tolist(), sample_id.tolist()


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("room", [0, 3_000, 1 << 22])
def test_batches_into_memory_match_contiguous_batches(
    runtime, io_backend: str, shuffle: bool, room: int
) -> None:
    """The same samples, bytes and boundaries as contiguous batches; the payloads are in
    the caller's memory exactly when they all fit there."""
    config = drt.ReaderConfig(seed=2, shuffle=shuffle, prefetch_size=8, io_backend=io_backend)
    plain = runtime.cached_dataset(_PATHS, reader_config=config)
    into = runtime.cached_dataset(_PATHS, reader_config=config)
    expected = _native.Iterator.open(plain._handle)
    got = _native.Iterator.open(into._handle)
    destination = np.empty(room, dtype=np.uint8)
    placed_any = unplaced_any = False
    try:
        for size in [1, 5, 64, 200, 1000] * 3:
            want = expected.next_batch(size, _CONTIGUOUS)
            want_contents = _contents(want)
            destination[:] = 0xAA
            batch, placed = got.next_batch_into(size, _STORED, destination)
            contents = _contents(batch)
            assert contents == want_contents
            total = len(contents[0])
            assert placed == (batch.count > 0 and 0 < room and total <= room)
            if placed:
                placed_any = True
                assert destination[:total].tobytes() == contents[0]
            elif batch.count:
                unplaced_any = True
            if want.count == 0:
                break
    finally:
        expected.close()
        got.close()
    # No room: never placed; some room: small batches placed, large ones not; much room:
    # every batch placed.
    assert (placed_any, unplaced_any) == {0: (False, True), 3_000: (True, True)}.get(
        room, (True, False)
    )


def _home(array: np.ndarray) -> np.ndarray:
    while array.base is not None:
        array = array.base.obj if isinstance(array.base, memoryview) else array.base
    return array


def test_copied_batches_are_built_in_the_pool_after_the_first(runtime, monkeypatch) -> None:
    """``iter_batches(copy=True)`` sizes each batch from the previous one (across
    iterators of a dataset), so every batch after the dataset's first is built in the
    pool by the library itself: one copy."""
    monkeypatch.setattr(dataset_module, "_POOL_BATCH_MIN_BYTES", 0)
    calls = []
    original = _native.Iterator.next_batch_into

    def spy(self, max_count, flags, destination):
        batch, placed = original(self, max_count, flags, destination)
        if batch.count:
            calls.append(placed)
        return batch, placed

    monkeypatch.setattr(_native.Iterator, "next_batch_into", spy)
    config = drt.ReaderConfig(seed=0, shuffle=False)
    dataset = runtime.cached_dataset([FIXTURES / "plain_many_shards"], reader_config=config)
    expected = [s.data for s in runtime.cached_dataset(_PATHS[1:], reader_config=config)]
    for _ in range(2):
        got = []
        homes = set()
        for batch in dataset.iter_batches(100):
            got += [batch.payload(i) for i in range(len(batch))]
            homes.add(id(_home(batch.data)))
        assert got == expected
        assert len(homes) == 1  # one pool
    # Only the dataset's first batch had no estimate (records vary: a batch may outgrow
    # the slack now and then, not most of the time).
    assert calls[0] is False
    assert sum(calls) >= len(calls) - 3


@pytest.mark.parametrize("shuffle", [False, True])
def test_staged_batches_match_batches_read_at_the_call(
    runtime, io_backend: str, shuffle: bool, monkeypatch, tmp_path
) -> None:
    """``iter_batches(copy=True)`` stages the next batches (``drt_iter_stage_batch``):
    ordered reads of the uncompressed cache have them read ahead into their memory, and
    every batch (bytes, boundaries, identities, metadata) equals what the same read
    gives without staging; shuffled reads stage nothing."""
    staged = []
    original = _native.Iterator.stage_batch

    def spy(self, max_count, destination):
        needed = original(self, max_count, destination)
        if destination is not None and 0 < needed <= len(destination):
            staged.append(needed)
        return needed

    monkeypatch.setattr(_native.Iterator, "stage_batch", spy)
    config = drt.ReaderConfig(seed=4, shuffle=shuffle, prefetch_size=8, io_backend=io_backend)
    # Two datasets reading the same stream (each window continues the one before) of a
    # cache whose batches of 1,200 are large enough to be staged (1 MiB).
    paths = [_large_cache(runtime, tmp_path)]
    staging = runtime.cached_dataset(paths, reader_config=config)
    unstaged = runtime.cached_dataset(paths, reader_config=config)

    def read(dataset: drt.CachedDataset, size: int) -> list[tuple]:
        return [
            (
                b.data.tobytes(),
                b.offsets.tolist(),
                b.cache_id.tolist(),
                b.sample_id.tolist(),
                b.metadata.rows(),
            )
            for b in dataset.iter_batches(size)
        ]

    for size in [1, 7, 1_200]:
        got = read(staging, size)
        with monkeypatch.context() as off:
            off.setattr(dataset_module._Gather, "_stage", lambda self, size: False)
            want = read(unstaged, size)
        assert got == want
    assert bool(staged) == (not shuffle)


class _Records:
    """3,000 records of 1 KiB (JSON of varied lengths): batches of 1,100 or more take
    the 1 MiB worth staging when read, 250 or more the 256 KiB worth it when copied out of
    the shard's mapping (these: local and in the page cache)."""

    name = "records"

    def __iter__(self):
        rng = np.random.default_rng(7)
        for i in range(3_000):
            yield drt.CacheInput(rng.bytes(1024), {"label": i, "name": "x" * (i % 37)})


def _large_cache(runtime, tmp_path) -> str:
    config = drt.WriterConfig(
        show_progress=False, shard_compression=drt.ShardCompression(algo="none")
    )
    [result] = runtime.write_cache(_Records(), tmp_path, writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    return result.path


def test_stage_batch_asks_and_refuses(runtime, tmp_path) -> None:
    """``stage_batch`` before the first batch stages nothing, nor for a batch under 256
    KiB (its shard mapped); without memory it only says how many bytes a batch needs
    (its records whole), and stages nothing into memory shorter than that; the staged
    batch is taken by the call for it, in place."""
    config = drt.ReaderConfig(seed=0, shuffle=False, prefetch_size=8)
    path = _large_cache(runtime, tmp_path)
    dataset = runtime.cached_dataset([path], reader_config=config)
    reference = _native.Iterator.open(runtime.cached_dataset([path], reader_config=config)._handle)
    iterator = _native.Iterator.open(dataset._handle)
    try:
        assert iterator.stage_batch(1_100, None) == 0
        memory = np.empty(1 << 21, dtype=np.uint8)
        first, _ = iterator.next_batch_into(5, _STORED, memory)
        assert _contents(first) == _contents(reference.next_batch(5, _CONTIGUOUS))
        assert iterator.stage_batch(200, None) == 0  # under 256 KiB: not worth it
        assert iterator.stage_batch(300, None) > 0
        needed = iterator.stage_batch(1_100, None)
        assert needed > 1_100 * 1024
        assert iterator.stage_batch(1_100, np.empty(needed - 1, dtype=np.uint8)) == needed
        region = np.empty(needed, dtype=np.uint8)
        assert iterator.stage_batch(1_100, region) == needed
        batch, placed = iterator.next_batch_into(1_100, _STORED, region)
        assert placed
        assert _contents(batch) == _contents(reference.next_batch(1_100, _CONTIGUOUS))
        # More than the payloads: each record's header and JSON too.
        assert needed > int(batch.arrays(False)[1][-1])
        with pytest.raises(ValueError):
            iterator.stage_batch(0, None)
    finally:
        iterator.close()
        reference.close()
