"""`CachedDataset.get_items`: many identities in one call, as one `SampleBatch`.

Every batch is checked against `get_item` of the same identities (payload, metadata
values and their types, identity), on both I/O backends, for random identities with
repeats and across caches, numpy and list inputs; errors are `get_item`'s for the first
failing identity in the caller's order.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import numpy as np
import pytest

import dataset_rt as drt
from dataset_rt.dataset import SampleBatch, _metadata_frame
from tests.conftest import FIXTURES

# Four caches with the same schema: uncompressed (one and many shards), LZ4, unicode name.
SAME_SCHEMA = ["plain_one_shard", "plain_many_shards", "lz4_many_shards", "unicode_é_name"]


def open_dataset(runtime, io_backend: str, paths: list[Path] | None = None, **options):
    config = drt.ReaderConfig(seed=3, shuffle=False, io_backend=io_backend, **options)
    paths = paths if paths is not None else [FIXTURES / name for name in SAME_SCHEMA]
    return runtime.cached_dataset(paths, reader_config=config)


def identities(dataset) -> list[tuple[int, int]]:
    """Every (cache_id, sample_id) of the dataset, in path order."""
    frame = dataset.get_metadata()
    return list(zip(frame["cache_id"].to_list(), frame["sample_id"].to_list()))


def first_identities(dataset, count: int) -> tuple[list[int], list[int]]:
    """The first ``count`` identities of the dataset as (cache_ids, sample_ids)."""
    first = identities(dataset)[:count]
    return [c for c, _ in first], [s for _, s in first]


def expect_same_as_get_item(dataset, batch, cache_ids, sample_ids) -> None:
    """``batch`` holds exactly what get_item returns for each identity, in order."""
    assert isinstance(batch, SampleBatch)
    n = len(cache_ids)
    assert len(batch) == n
    assert batch.offsets.dtype == np.uint64 and len(batch.offsets) == n + 1
    assert batch.data.dtype == np.uint8 and int(batch.offsets[-1]) == len(batch.data)
    assert batch.cache_id.dtype == np.uint64 and batch.sample_id.dtype == np.uint64
    assert batch.cache_id.tolist() == [int(c) for c in cache_ids]
    assert batch.sample_id.tolist() == [int(s) for s in sample_ids]
    rows = batch.metadata.to_dicts()
    assert len(rows) == n
    for i, (cid, sid) in enumerate(zip(cache_ids, sample_ids)):
        sample = dataset.get_item(int(cid), int(sid))
        assert batch.payload(i) == sample.data
        assert rows[i] == sample.metadata
        for key, value in sample.metadata.items():
            assert type(rows[i][key]) is type(value)
            if isinstance(value, float):  # bit for bit
                assert struct.pack("<d", rows[i][key]) == struct.pack("<d", value)


def test_random_identities_with_repeats_across_caches(runtime, io_backend: str) -> None:
    dataset = open_dataset(runtime, io_backend)
    every = identities(dataset)
    rng = random.Random(5)
    for count in (1, 2, 7, 300, 2000):
        picked = [rng.choice(every) for _ in range(count)]
        # Repeats: the same identity several times, next to each other and apart.
        picked += picked[: count // 3] + [picked[0]] * 3
        cache_ids = [c for c, _ in picked]
        sample_ids = [s for _, s in picked]
        expect_same_as_get_item(
            dataset, dataset.get_items(cache_ids, sample_ids), cache_ids, sample_ids
        )
        arrays = np.array(cache_ids, dtype=np.uint64), np.array(sample_ids, dtype=np.uint64)
        expect_same_as_get_item(dataset, dataset.get_items(*arrays), cache_ids, sample_ids)


def test_every_sample_in_every_order(runtime, io_backend: str) -> None:
    dataset = open_dataset(runtime, io_backend)
    every = identities(dataset)
    for order in (every, every[::-1], random.Random(9).sample(every, len(every))):
        cache_ids = np.array([c for c, _ in order], dtype=np.uint64)
        sample_ids = np.array([s for _, s in order], dtype=np.uint64)
        batch = dataset.get_items(cache_ids, sample_ids, copy=False)
        expect_same_as_get_item(dataset, batch, cache_ids, sample_ids)
    # Reads are planned: the whole dataset (every shard's records back to back) takes at
    # most one read per shard and per coalescing limit, not one per sample.
    before = dataset.io_stats["lookup_reads"]
    dataset.get_items(cache_ids, sample_ids)
    assert dataset.io_stats["lookup_reads"] - before < len(every) // 4


def test_integer_array_types_and_sequences(runtime, io_backend: str) -> None:
    dataset = open_dataset(runtime, io_backend)
    every = identities(dataset)
    picked = random.Random(1).sample(every, 50)
    cache_ids = [c for c, _ in picked]
    sample_ids = [s for _, s in picked]
    want = dataset.get_items(cache_ids, sample_ids)
    for dtype in (np.uint64, np.int64):
        for cids in (np.array(cache_ids, dtype=np.uint64),):
            sids = np.array(sample_ids, dtype=dtype)
            got = dataset.get_items(cids, sids)
            assert got.data.tobytes() == want.data.tobytes()
            assert got.metadata.equals(want.metadata)
    # Small integer types, tuples, ranges and strided arrays work too.
    one = [c for c, _ in every if c == cache_ids[0]][:5]
    assert len(one) == 5
    got = dataset.get_items(tuple(one), range(5))
    expect_same_as_get_item(dataset, got, one, list(range(5)))
    strided = np.arange(10, dtype=np.int32)[::2]
    got = dataset.get_items(np.array(one, dtype=np.uint64), strided)
    expect_same_as_get_item(dataset, got, one, [0, 2, 4, 6, 8])
    # Object arrays hold Python objects, checked one by one as in a list.
    got = dataset.get_items(np.array(one, dtype=object), np.array(range(5), dtype=object))
    expect_same_as_get_item(dataset, got, one, list(range(5)))
    got, want = errors_of(
        dataset, np.array(one[:2], dtype=object), np.array([0, 1.5], dtype=object)
    )
    assert got == want == (TypeError, "cache_id and sample_id must be integers")


def test_empty_request(runtime, io_backend: str) -> None:
    dataset = open_dataset(runtime, io_backend)
    full = dataset.get_items(*map(list, zip(*identities(dataset)[:3])))
    for empty in (([], []), (np.zeros(0, np.uint64), np.zeros(0, np.uint64))):
        batch = dataset.get_items(*empty)
        assert len(batch) == 0
        assert batch.offsets.tolist() == [0] and len(batch.data) == 0
        assert batch.cache_id.dtype == np.uint64 and batch.sample_id.dtype == np.uint64
        assert batch.metadata.schema == full.metadata.schema
        assert batch.metadata.height == 0


def errors_of(dataset, cache_ids, sample_ids) -> tuple[tuple[type, str], tuple[type, str]]:
    """(get_items' exception, get_item's exception for the first failing identity)."""
    with pytest.raises(Exception) as batch_error:
        dataset.get_items(cache_ids, sample_ids)
    # Elements of integer arrays stand for the Python ints they hold.
    cache_ids, sample_ids = (
        v.tolist() if isinstance(v, np.ndarray) and v.dtype.kind in "iu" else v
        for v in (cache_ids, sample_ids)
    )
    for cid, sid in zip(cache_ids, sample_ids):
        try:
            dataset.get_item(cid, sid)
        except Exception as exc:
            single = (type(exc), str(exc))
            break
    else:
        pytest.fail("no identity fails get_item")
    return (batch_error.type, str(batch_error.value)), single


def test_errors_are_get_items_for_the_first_failing_identity(runtime, io_backend: str) -> None:
    dataset = open_dataset(runtime, io_backend)
    (good_c, good_s), (other_c, other_s) = identities(dataset)[0], identities(dataset)[-1]
    cases = [
        ([good_c, 12345], [good_s, 0]),  # unknown cache_id
        ([good_c, good_c], [good_s, 10**6]),  # sample_id past the cache's end
        ([other_c, good_c, good_c], [other_s, -1, 10**6]),  # negative, then past the end
        ([good_c, 2**64], [good_s, 0]),  # cache_id too large for u64
        ([good_c, good_c], [good_s, 1.0]),  # not an int
        ([good_c, good_c], [good_s, True]),  # bool is not an int for get_item
        ([good_c, 7, good_c], [good_s, 0, -5]),  # native error before a Python one
        ([good_c, good_c, 7], [good_s, -5, 0]),  # Python error before a native one
        ([good_c, good_c], [good_s, np.int64(1)]),  # numpy scalar in a list
    ]
    for cache_ids, sample_ids in cases:
        got, want = errors_of(dataset, cache_ids, sample_ids)
        assert got == want, (cache_ids, sample_ids)
    # Numpy arrays: signed negatives, floats and bools fail like the values they hold.
    got, want = errors_of(
        dataset, np.array([good_c, good_c], np.uint64), np.array([good_s, -3], np.int64)
    )
    assert got == want == (IndexError, "sample_id -3 is out of range")
    with pytest.raises(TypeError, match=r"^cache_id and sample_id must be integers$"):
        dataset.get_items(np.array([good_c], np.uint64), np.array([1.0]))
    with pytest.raises(TypeError, match=r"^cache_id and sample_id must be integers$"):
        dataset.get_items(np.array([good_c], np.uint64), np.array([True]))
    # Shapes and lengths.
    with pytest.raises(ValueError, match="same length"):
        dataset.get_items([good_c], [1, 2])
    with pytest.raises(ValueError, match="one-dimensional"):
        dataset.get_items(np.zeros((2, 2), np.uint64), np.zeros(4, np.uint64))
    # The dataset stays usable.
    expect_same_as_get_item(dataset, dataset.get_items([good_c], [good_s]), [good_c], [good_s])


def test_unreadable_record_fails_like_get_item(runtime, io_backend: str, fixture_copy) -> None:
    """A record whose index row points past its shard: the whole call fails with get_item's
    error, wherever the identity is in the request."""
    path = fixture_copy("plain_one_shard")
    index = bytearray((path / "index.bin").read_bytes())
    # Row 7 (shard_id, offset, byte_len as u64 LE): its offset moved past the shard's end.
    struct.pack_into("<Q", index, 7 * 24 + 8, 1 << 40)
    (path / "index.bin").write_bytes(bytes(index))
    dataset = open_dataset(runtime, io_backend, [path])
    cache_id = identities(dataset)[0][0]
    got, want = errors_of(dataset, [cache_id] * 4, [3, 9, 7, 1])
    assert got == want
    assert want[0] is RuntimeError and "failed to fill whole buffer" in want[1]
    # Without the broken record, the same call succeeds.
    fine = [3, 9, 1]
    batch = dataset.get_items([cache_id] * 3, fine)
    expect_same_as_get_item(dataset, batch, [cache_id] * 3, fine)


def test_copy_false_views_are_valid_until_the_next_call(runtime, io_backend: str) -> None:
    dataset = open_dataset(runtime, io_backend)
    cache_ids, sample_ids = first_identities(dataset, 20)
    owned = dataset.get_items(cache_ids, sample_ids)
    view = dataset.get_items(cache_ids, sample_ids, copy=False)
    assert view.data.tobytes() == owned.data.tobytes()
    assert not view.data.flags.owndata and owned.data.flags.owndata


def test_copy_false_views_outlive_the_dataset(io_backend: str) -> None:
    """The views keep the lookup whose buffer they show alive: dropping the dataset (and
    its runtime) before them frees nothing they point at."""
    import gc

    runtime = drt.DatasetRuntime(num_workers=2)
    dataset = open_dataset(runtime, io_backend)
    cache_ids, sample_ids = first_identities(dataset, 30)
    owned = dataset.get_items(cache_ids, sample_ids)
    view = dataset.get_items(cache_ids, sample_ids, copy=False)
    del dataset, runtime
    gc.collect()
    # Memory freed and reused would show other bytes (or crash the process).
    for _ in range(50):
        bytearray(len(view.data))
    assert view.data.tobytes() == owned.data.tobytes()
    assert view.sample_id.tolist() == sample_ids and view.cache_id.tolist() == cache_ids


class _SizesSource:
    """Payloads around and far above get_item's initial 64 KiB row buffer."""

    name = "sizes"
    sizes = (0, 10, 65_000, 70_000, 300_000, 5, 1 << 20)

    def __iter__(self):
        for i, size in enumerate(self.sizes):
            yield drt.CacheInput(
                data=bytes([i + 1]) * size, metadata={"i": i, "s": "é" * i, "f": i / 3}
            )


def test_get_item_of_samples_larger_than_its_buffer(runtime, io_backend: str, tmp_path) -> None:
    """get_item reads into a buffer it grows to the largest sample: every size comes
    back whole, before and after the buffer grew, in any order."""
    config = drt.WriterConfig(show_progress=False)
    [result] = runtime.write_cache(_SizesSource(), tmp_path, writer_config=config)
    assert type(result).__name__ == "CacheWriteSuccess", result
    dataset = open_dataset(runtime, io_backend, [tmp_path / "sizes"])
    cache_id = identities(dataset)[0][0]
    order = [1, 6, 0, 4, 2, 3, 5, 6, 1]
    for sid in order:
        sample = dataset.get_item(cache_id, sid)
        assert sample.data == bytes([sid + 1]) * _SizesSource.sizes[sid]
        assert sample.metadata == {"i": sid, "s": "é" * sid, "f": sid / 3}
        assert (sample.cache_id, sample.sample_id) == (cache_id, sid)
    batch = dataset.get_items([cache_id] * len(order), order)
    expect_same_as_get_item(dataset, batch, [cache_id] * len(order), order)


class _ShapesSource:
    """Records whose payload and string lengths repeat, or change in one part only:
    get_item's precompiled unpack of a repeated row shape must not serve another."""

    name = "shapes"
    # (payload length, a, b): "é" and "ab" have the same UTF-8 length, other text.
    rows = (
        (100, "ab", ""),
        (100, "ab", ""),
        (100, "é", ""),
        (100, "abc", ""),
        (100, "ab", "x"),
        (101, "ab", ""),
        (0, "ab", ""),
        (0, "", ""),
        (70_000, "ab", ""),
        (70_000, "ab", ""),
    )

    def __iter__(self):
        for i, (size, a, b) in enumerate(self.rows):
            yield drt.CacheInput(
                data=bytes([i + 1]) * size, metadata={"i": i, "a": a, "b": b, "t": i % 2 == 0}
            )


def test_get_item_of_rows_of_repeated_and_changing_shapes(
    runtime, io_backend: str, tmp_path
) -> None:
    """get_item of rows whose shapes (payload and string lengths) repeat, then change in
    the payload, in one string, in another, or to equal lengths of other text, in
    orders that repeat each shape twice or more before another: every sample whole."""
    config = drt.WriterConfig(show_progress=False)
    [result] = runtime.write_cache(_ShapesSource(), tmp_path, writer_config=config)
    assert type(result).__name__ == "CacheWriteSuccess", result
    dataset = open_dataset(runtime, io_backend, [tmp_path / "shapes"])
    cache_id = identities(dataset)[0][0]
    orders = [
        [0, 1, 0, 2, 0, 1, 3, 4, 5, 0, 1],
        [2, 2, 0, 2, 1, 6, 6, 7, 6, 7, 7, 0],
        [8, 9, 8, 0, 0, 9, 4, 4, 3, 5, 5, 2],
        list(range(10)) * 2,
        random.Random(5).choices(range(10), k=200),
    ]
    for order in orders:
        for sid in order:
            size, a, b = _ShapesSource.rows[sid]
            sample = dataset.get_item(cache_id, sid)
            assert sample.data == bytes([sid + 1]) * size, (order, sid)
            assert sample.metadata == {"i": sid, "a": a, "b": b, "t": sid % 2 == 0}, sid
            assert type(sample.metadata["t"]) is bool
            assert (sample.cache_id, sample.sample_id) == (cache_id, sid)


def test_get_item_refuses_arguments_alike_before_and_after_its_first_read(
    runtime, io_backend: str
) -> None:
    """get_item's argument errors (type, then 64-bit range, then the library's) are the
    same on a fresh dataset and once its row getter is bound, with no chained context."""
    good_c, good_s = identities(open_dataset(runtime, io_backend))[0]
    cases = [
        ((good_c, -1), IndexError, "sample_id -1 is out of range"),
        ((-1, good_s), IndexError, "cache_id -1 is out of range"),
        ((2**64, 0), IndexError, f"cache_id {2**64} is out of range"),
        ((good_c, 2**64), IndexError, f"sample_id {2**64} is out of range"),
        ((-1, 2**64), IndexError, "cache_id -1 is out of range"),
        ((good_c, True), TypeError, "cache_id and sample_id must be integers"),
        ((1.0, -1), TypeError, "cache_id and sample_id must be integers"),
        ((good_c, 10**6), IndexError, f"sample_id {10**6} is out of range for cache_id {good_c}"),
        ((12345, 0), IndexError, "cache_id 12345 is out of range"),
    ]
    for args, kind, message in cases:
        for first in (True, False):
            dataset = open_dataset(runtime, io_backend)
            if not first:
                dataset.get_item(good_c, good_s)
            with pytest.raises(kind) as info:
                dataset.get_item(*args)
            assert str(info.value) == message, (args, first)
            assert info.value.__context__ is None and info.value.__cause__ is None
            assert dataset.get_item(good_c, good_s).sample_id == good_s


def test_get_item_keeps_its_name_and_documentation_once_bound(runtime, io_backend: str) -> None:
    """After the first call get_item is the dataset's own row getter (no method frame):
    it keeps the method's name, documentation and signature."""
    import inspect

    dataset = open_dataset(runtime, io_backend)
    key = identities(dataset)[0]
    method = type(dataset).get_item
    for _ in range(2):
        assert dataset.get_item.__name__ == "get_item"
        assert dataset.get_item.__qualname__ == method.__qualname__
        assert dataset.get_item.__doc__ == method.__doc__
        assert list(inspect.signature(dataset.get_item).parameters) == ["cache_id", "sample_id"]
        assert dataset.get_item(*key) == method(dataset, *key)
    assert "get_item" in vars(dataset)  # bound by the first call


def test_get_item_from_several_threads(runtime, io_backend: str) -> None:
    """Concurrent get_item calls share one lookup and row buffer: each gets its sample."""
    import threading

    dataset = open_dataset(runtime, io_backend)
    every = identities(dataset)
    want = {key: dataset.get_item(*key) for key in every}
    fresh = open_dataset(runtime, io_backend)  # its first calls race, too
    failures: list[object] = []

    def read(seed: int) -> None:
        order = random.Random(seed).choices(every, k=400)
        for key in order:
            got = fresh.get_item(*key)
            if got != want[key]:
                failures.append((key, got))

    threads = [threading.Thread(target=read, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_lookup_get_row_binding_packs_the_sample(runtime, io_backend: str) -> None:
    """``_native.Lookup.get_row``: the packed size, then the payload after the slots; only
    the size when the buffer is too small."""
    dataset = open_dataset(runtime, io_backend)
    cache_id, sample_id = identities(dataset)[3]
    want = dataset.get_item(cache_id, sample_id)
    lookup = dataset._lookup
    small = bytearray(8)
    size = lookup.get_row(cache_id, sample_id, small)
    row = bytearray(size)
    assert lookup.get_row(cache_id, sample_id, row) == size
    payload_len = struct.unpack_from("<Q", row, 8)[0]
    start = 16 + 8 * len(want.metadata)
    assert bytes(row[start : start + payload_len]) == want.data
    with pytest.raises(IndexError, match=r"^cache_id 12345 is out of range$"):
        lookup.get_row(12345, 0, row)


def test_lookup_row_reads_get_rows_bytes_into_the_registered_buffer(
    runtime, io_backend: str
) -> None:
    """``drt_lookup_row`` (ABI 1.11, what ``get_item`` calls): the bytes of
    ``drt_lookup_get_row`` in the buffer ``set_row_buffer`` registered, the packed size as
    the result (only it written when the buffer is too small), a negative status on
    failure, and ``DRT_E_INVALID_ARGUMENT`` without a registered buffer."""
    from dataset_rt._native import Lookup, last_error, lib

    dataset = open_dataset(runtime, io_backend)
    lookup = Lookup.open(dataset._handle)
    try:
        cache_id, sample_id = identities(dataset)[5]
        assert lib.drt_lookup_row(lookup._ptr, cache_id, sample_id) == lib.DRT_E_INVALID_ARGUMENT
        assert "drt_lookup_set_row_buffer" in last_error()
        with pytest.raises(ValueError, match="at least 8 bytes, got 4"):
            lookup.set_row_buffer(4)
        small = lookup.set_row_buffer(8)
        size = lib.drt_lookup_row(lookup._ptr, cache_id, sample_id)
        assert size > 16 and struct.unpack_from("<Q", small)[0] == size
        want = bytearray(size)
        assert lookup.get_row(cache_id, sample_id, want) == size
        for every in identities(dataset)[::7]:
            want = bytearray(1 << 16)
            size = lookup.get_row(*every, want)
            row = lookup.set_row_buffer(size)
            assert lookup.row(*every) == size
            assert bytes(row) == bytes(want[:size])
        assert lib.drt_lookup_row(lookup._ptr, 12345, 0) == lib.DRT_E_INDEX
        assert last_error() == "cache_id 12345 is out of range"
        with pytest.raises(IndexError, match=r"^cache_id 12345 is out of range$"):
            lookup.row(12345, 0)
    finally:
        lookup.close()


def test_lookup_stored_rows_and_batch_run_bindings(runtime, io_backend: str) -> None:
    """``drt_lookup_stored_rows`` (ABI 1.13): a cache's stored metadata rows as a batch
    with get_items' identities and metadata, empty payloads, stopping at the cache's end;
    get_items' IndexError for an unknown cache or first sample. ``drt_batch_run``: the
    leading run of one cache's consecutive samples."""
    from dataset_rt import _native

    dataset = open_dataset(runtime, io_backend)
    lookup = _native.Lookup.open(dataset._handle)
    try:
        caches: dict[int, list[int]] = {}
        for cid, sid in identities(dataset):
            caches.setdefault(cid, []).append(sid)
        for cid, sids in caches.items():
            first = len(sids) // 3
            batch = lookup.stored_rows(cid, first, 10**9)
            count = len(sids) - first
            assert batch.count == count
            assert batch.run() == (cid, first, count)
            assert batch.lengths_and_ids()[0].tolist() == [0] * count
            frame = _metadata_frame(batch, dataset._columns)
            want = dataset.get_items([cid] * count, sids[first:])
            assert frame.equals(want.metadata)
            assert want.cache_id.tolist() == [cid] * count
        cid = next(iter(caches))
        with pytest.raises(IndexError, match=r"^cache_id 12345 is out of range$"):
            lookup.stored_rows(12345, 0, 1)
        with pytest.raises(
            IndexError, match=rf"^sample_id 120 is out of range for cache_id {cid}$"
        ):
            lookup.stored_rows(cid, 120, 1)
        assert lookup.stored_rows(cid, 119, 0).run() == (0, 0, 0)
        # A batch of two caches, and one that skips a sample: runs end there.
        other = list(caches)[1]
        assert lookup.get([cid, cid, other], [118, 119, 0]).run() == (cid, 118, 2)
        assert lookup.get([cid, cid, cid], [5, 7, 8]).run() == (cid, 5, 1)
    finally:
        lookup.close()
