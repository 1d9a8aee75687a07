"""Every reference cache reads back exactly as its expected.json says."""

from __future__ import annotations

import hashlib

import pytest

import dataset_rt as drt
from tests.conftest import FIXTURE_NAMES, FIXTURES, expected


def check_sample(sample: drt.CachedSample, want: dict, cache_id: int) -> None:
    assert sample.sample_id == want["sample_id"]
    assert sample.cache_id == cache_id
    assert len(sample.data) == want["len"]
    assert hashlib.sha256(sample.data).hexdigest() == want["sha256"]
    assert sample.metadata == want["metadata"]
    # Floats come back bit for bit (the reference's JSON parser gets 271/3.0 wrong).
    for key, value in want["metadata"].items():
        assert type(sample.metadata[key]) is type(value)
    assert list(sample.metadata) == sorted(want["metadata"], key=lambda k: k.encode())


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate_cache"])
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_reference_cache_reads_back(runtime, io_backend: str, name: str, validate: bool) -> None:
    want = expected(name)["samples"]
    dataset = runtime.cached_dataset(
        [FIXTURES / name],
        reader_config=drt.ReaderConfig(
            seed=1, shuffle=False, validate_cache=validate, io_backend=io_backend
        ),
    )
    assert len(dataset) == len(want)
    samples = list(dataset)
    assert len(samples) == len(want)
    cache_id = samples[0].cache_id
    for sample, row in zip(samples, want):
        check_sample(sample, row, cache_id)
    # Random access, in reverse order, returns the same samples and moves no cursor.
    for row in reversed(want):
        check_sample(dataset.get_item(cache_id, row["sample_id"]), row, cache_id)
    assert [s.sample_id for s in dataset] == [row["sample_id"] for row in want]


def test_score_271_many_shards(runtime) -> None:
    dataset = runtime.cached_dataset(
        [FIXTURES / "plain_many_shards"],
        reader_config=drt.ReaderConfig(seed=0, validate_cache=True),
    )
    cache_id = next(iter(dataset)).cache_id
    assert dataset.get_item(cache_id, 271).metadata["score"] == 90.33333333333333


def test_multi_cache_ordered_windows(runtime, io_backend: str) -> None:
    """Two caches in paths order, cyclic windows across iterators (reference 3.2)."""
    paths = [FIXTURES / "unicode_é_name", FIXTURES / "plain_one_shard"]
    dataset = runtime.cached_dataset(
        paths, reader_config=drt.ReaderConfig(seed=0, shuffle=False, io_backend=io_backend)
    )
    assert len(dataset) == 130
    dataset.set_epoch_len(100)
    flat = [(s.cache_id, s.sample_id) for _ in range(3) for s in dataset]
    first_id, second_id = flat[0][0], flat[10][0]
    assert first_id != second_id
    order = [(first_id, i) for i in range(10)] + [(second_id, i) for i in range(120)]
    assert flat == (order * 3)[:300]


def test_abandoned_iterator_uses_its_window(runtime, io_backend: str) -> None:
    dataset = runtime.cached_dataset(
        [FIXTURES / "unicode_é_name"],
        reader_config=drt.ReaderConfig(seed=0, shuffle=False, io_backend=io_backend),
    )
    dataset.set_epoch_len(3)
    it = iter(dataset)
    assert next(it).sample_id == 0
    del it
    assert [s.sample_id for s in dataset] == [3, 4, 5]
    pending = iter(dataset)  # no window reserved until the first next()
    dataset.set_epoch_len(2)
    assert [s.sample_id for s in dataset] == [6, 7]
    assert [s.sample_id for s in pending] == [8, 9]
