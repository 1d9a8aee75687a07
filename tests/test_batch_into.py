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
