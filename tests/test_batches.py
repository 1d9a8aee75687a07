"""The batch API yields the same stream as per-sample iteration."""

from __future__ import annotations

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
