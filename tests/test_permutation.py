"""ReaderConfig(sampling="permutation"): passes over the active rows (issue: permutation epochs)."""

from __future__ import annotations

from collections import Counter

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

import dataset_rt as drt
from tests.conftest import FIXTURES

CACHE = FIXTURES / "plain_many_shards"  # 300 samples


def stream(
    runtime, seed: int, windows: list[int], backend: str = "threads", table=None
) -> list[int]:
    config = drt.ReaderConfig(seed=seed, sampling="permutation", io_backend=backend)
    dataset = runtime.cached_dataset([CACHE], reader_config=config)
    if table is not None:
        dataset.update_metadata(table(dataset.get_metadata()))
    out: list[int] = []
    for size in windows:
        dataset.set_epoch_len(size)
        out += [s.sample_id for s in dataset]
    return out


def test_every_row_once_per_pass_and_passes_differ(runtime) -> None:
    flat = stream(runtime, 7, [300, 300, 300])
    passes = [flat[0:300], flat[300:600], flat[600:900]]
    for p in passes:
        assert sorted(p) == list(range(300))
    assert passes[0] != passes[1] != passes[2]
    assert passes[0] != list(range(300))
    assert stream(runtime, 8, [300]) != passes[0]


def test_windows_cut_the_same_stream_and_backends_agree(runtime, io_backend: str) -> None:
    """Any window sizes (crossing pass boundaries) read the same positions: the row at
    each stream position is computed directly, which is what resuming relies on."""
    whole = stream(runtime, 3, [750], io_backend)
    assert stream(runtime, 3, [1, 299, 2, 100, 348], io_backend) == whole
    assert stream(runtime, 3, [750], "threads") == whole


def test_weights_count_only_through_duplicates(runtime) -> None:
    def table(df: pl.DataFrame) -> pl.DataFrame:
        head = df.head(10).with_columns(pl.lit(1000.0).alias("weight"))
        return pl.concat([head, head.head(2)])

    flat = stream(runtime, 1, [24], table=table)
    counts = Counter(flat)
    assert counts[0] == 4 and counts[1] == 4  # duplicated rows: twice per pass
    assert all(counts[i] == 2 for i in range(2, 10))


def test_default_is_the_reference_and_ignored_when_ordered(runtime) -> None:
    assert drt.ReaderConfig(seed=1).model_dump_json() == (
        '{"seed":1,"prefetch_size":64,"shuffle":true,"validate_cache":false}'
    )
    assert "permutation" in drt.ReaderConfig(seed=1, sampling="permutation").model_dump_json()
    ordered = runtime.cached_dataset(
        [CACHE], reader_config=drt.ReaderConfig(seed=1, shuffle=False, sampling="permutation")
    )
    assert [s.sample_id for s in ordered][:5] == [0, 1, 2, 3, 4]


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=300), seed=st.integers(min_value=0, max_value=2**64 - 1)
)
def test_permutation_property(runtime, n: int, seed: int) -> None:
    def table(df: pl.DataFrame) -> pl.DataFrame:
        return df.head(n)

    flat = stream(runtime, seed, [2 * n], table=table)
    assert sorted(flat[:n]) == list(range(n)) == sorted(flat[n:])
