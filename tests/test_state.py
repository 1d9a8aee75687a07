"""Exact resume of a dataset's stream (state_dict / load_state_dict), the active-table
digest and explicit-position reading (drt_iter_open_range). No PyTorch needed."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sources import Numbers

import dataset_rt as drt


def ids(samples) -> list[tuple[int, int]]:
    return [(s.cache_id, s.sample_id) for s in samples]


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("state")
    runtime = drt.DatasetRuntime(num_workers=2)
    result = runtime.from_cache_sources(
        [Numbers("a", 7), Numbers("b", 5)], base, reader_config=drt.ReaderConfig(seed=0)
    )
    return list(result.dataset.cache_paths)


def open_dataset(caches: list[Path], shuffle: bool, sampling: str = "with_replacement"):
    runtime = drt.DatasetRuntime(num_workers=1)
    config = drt.ReaderConfig(seed=11, shuffle=shuffle, prefetch_size=3, sampling=sampling)
    return runtime.cached_dataset(caches, reader_config=config)


MODES = [(False, "with_replacement"), (True, "with_replacement"), (True, "permutation")]


def stream(dataset, samples: int) -> list[tuple[int, int]]:
    """The first ``samples`` of consecutive per-sample iterators."""
    passes = (iter(dataset) for _ in itertools.count())
    return ids(itertools.islice(itertools.chain.from_iterable(passes), samples))


@pytest.mark.parametrize(("shuffle", "sampling"), MODES)
@settings(max_examples=25, deadline=None)
@given(epoch_len=st.integers(1, 9), cut=st.integers(0, 30), batches=st.booleans())
def test_resume_continues_the_uninterrupted_stream(
    caches: list[Path], shuffle: bool, sampling: str, epoch_len: int, cut: int, batches: bool
) -> None:
    full = open_dataset(caches, shuffle, sampling)
    full.set_epoch_len(epoch_len)
    expected = stream(full, 40)

    first = open_dataset(caches, shuffle, sampling)
    first.set_epoch_len(epoch_len)
    got: list[tuple[int, int]] = []
    # Read `cut` samples through whole iterators, the last one interrupted mid-window
    # (per-sample or batch iterators), and keep it open while saving.
    live = None
    while len(got) < cut:
        if batches:
            live = first.iter_batches(2)
            for batch in live:
                got.extend(zip(batch.cache_id.tolist(), batch.sample_id.tolist()))
                if len(got) >= cut:
                    break
        else:
            live = iter(first)
            for sample in live:
                got.append((sample.cache_id, sample.sample_id))
                if len(got) >= cut:
                    break
    state = json.loads(json.dumps(first.state_dict()))
    assert live is not None or cut == 0

    second = open_dataset(caches, shuffle, sampling)
    second.load_state_dict(state)
    assert second.state_dict() == state
    got += stream(second, 40 - len(got))
    assert got == expected


def test_closed_iterator_gives_up_its_window(caches: list[Path]) -> None:
    dataset = open_dataset(caches, shuffle=False)
    dataset.set_epoch_len(5)
    it = iter(dataset)
    next(it)
    it.close()  # the rest of window [0, 5) is skipped, as in an uninterrupted run
    state = dataset.state_dict()
    assert (state["position"], state["window_end"]) == (5, 5)
    again = open_dataset(caches, shuffle=False)
    again.load_state_dict(state)
    assert ids(again)[:1] == ids(itertools.islice(dataset, 1))


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_window_that_crosses_2_to_the_64_resumes(caches: list[Path], shuffle: bool) -> None:
    """Positions wrap modulo 2**64 and so do windows: a saved window that crosses 2**64
    (its window_end below its position) loads and continues the stream."""
    full, first = open_dataset(caches, shuffle), open_dataset(caches, shuffle)
    for dataset in (full, first):
        next(iter(dataset))  # window [0, len) given up
        dataset.set_epoch_len(2**63 - 1)
        next(iter(dataset))  # window [len, len + 2**63 - 1) given up
    expected = list(itertools.islice(ids(itertools.islice(full, 6)), 6))
    live = iter(first)  # its window crosses 2**64
    got = [(s.cache_id, s.sample_id) for s in itertools.islice(live, 2)]
    state = first.state_dict()
    assert state["window_end"] < state["position"]
    again = open_dataset(caches, shuffle)
    again.load_state_dict(state)
    assert again.state_dict() == state
    got += ids(itertools.islice(again, 4))
    assert got == expected


@pytest.mark.parametrize("too_long", [2**63, 2**64 - 1])
def test_an_epoch_length_len_cannot_return_is_refused_unchanged(
    caches: list[Path], too_long: int
) -> None:
    """0.4.8 sets such a length and then raises from len(), leaving a dataset whose
    state cannot be described; it is refused before anything changes."""
    dataset = open_dataset(caches, shuffle=True)
    before = len(dataset)
    with pytest.raises(OverflowError, match="epoch_len must be below 2\\*\\*63"):
        dataset.set_epoch_len(too_long)
    assert len(dataset) == before
    state = dataset.state_dict()
    with pytest.raises(ValueError, match=r"state\['epoch_len'\] must be from 1 to 2\*\*63 - 1"):
        dataset.load_state_dict({**state, "epoch_len": too_long})
    assert dataset.state_dict() == state


def test_state_is_small_and_names_the_table(caches: list[Path]) -> None:
    dataset = open_dataset(caches, shuffle=True)
    state = dataset.state_dict()
    assert set(state) == {
        "format",
        "position",
        "window_end",
        "epoch_len",
        "shuffle",
        "seed",
        "sampling",
        "table_digest",
    }
    assert len(json.dumps(state)) < 400


def test_table_digest_follows_the_active_table(caches: list[Path]) -> None:
    a = open_dataset(caches, shuffle=True)
    b = open_dataset(caches, shuffle=False)
    assert a.table_digest() == b.table_digest()  # same caches, same default table
    default = a.table_digest()
    table = a.get_metadata()
    a.update_metadata(table)
    assert a.table_digest() != default  # weighted table vs the default's uniform draws
    b.update_metadata(table)
    assert a.table_digest() == b.table_digest()
    b.update_metadata(table.with_columns(weight=pl.Series([2.0] * table.height)))
    assert b.table_digest() != a.table_digest()
    a.update_metadata(table.reverse())
    assert a.table_digest() != b.table_digest()


def test_load_state_dict_rejects_another_stream(caches: list[Path]) -> None:
    source = open_dataset(caches, shuffle=True)
    state = source.state_dict()
    filtered = open_dataset(caches, shuffle=True)
    filtered.update_metadata(filtered.get_metadata().head(4))
    with pytest.raises(ValueError, match="different active table"):
        filtered.load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle=True"):
        open_dataset(caches, shuffle=False).load_state_dict(state)
    with pytest.raises(ValueError, match="sampling='with_replacement'"):
        open_dataset(caches, shuffle=True, sampling="permutation").load_state_dict(state)
    with pytest.raises(ValueError, match="format"):
        source.load_state_dict({"position": 3})
    with pytest.raises(ValueError, match="position"):
        source.load_state_dict({**state, "position": -1})
    with pytest.raises(ValueError, match="window_end"):
        source.load_state_dict({**state, "window_end": 2**64})
    assert source.state_dict() == state  # nothing changed


@pytest.mark.parametrize(("shuffle", "sampling"), MODES)
def test_range_reads_reproduce_stream_positions(
    caches: list[Path], shuffle: bool, sampling: str
) -> None:
    dataset = open_dataset(caches, shuffle, sampling)
    dataset.set_epoch_len(50)
    positions = ids(dataset)
    reader = open_dataset(caches, shuffle, sampling)
    # Blocks of 3 every 7 positions from 2: 2 3 4 | 9 10 11 | 16 17.
    got = ids(reader._iter_range(2, 8, 3, 7))
    assert got == [positions[p] for p in (2, 3, 4, 9, 10, 11, 16, 17)]
    assert ids(reader._iter_range(5, 4)) == positions[5:9]
    assert reader.state_dict()["position"] == 0  # range reads never move the stream
    with pytest.raises(ValueError, match="block_stride 2 is smaller than block_len 3"):
        list(reader._iter_range(0, 4, 3, 2))
