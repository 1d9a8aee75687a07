"""Per-sample iteration (``for s in ds``): the batch shapes it asks for (contiguous
batches for small records, slot batches for large ones), how it turns them into Python
objects, and that none of this changes a sample."""

from __future__ import annotations

import gc
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import dataset_rt as drt
from dataset_rt import dataset as dataset_module


class _Source:
    """A cache source of fixed ``(payload, metadata)`` records."""

    def __init__(self, name: str, records: list[tuple[bytes, dict[str, Any]]]) -> None:
        self.name = name
        self.records = records

    def __iter__(self) -> Any:
        return (drt.CacheInput(data, meta) for data, meta in self.records)


def _write(
    runtime: Any, base: Path, name: str, records: list[tuple[bytes, dict[str, Any]]]
) -> Path:
    config = drt.WriterConfig(
        show_progress=False, shard_compression=drt.ShardCompression(algo="none")
    )
    [result] = runtime.write_cache(_Source(name, records), base, writer_config=config)
    assert type(result).__name__ == "CacheWriteSuccess", result
    return base / name


def _open(runtime: Any, path: Path, io_backend: str, shuffle: bool, **extra: Any) -> Any:
    config = drt.ReaderConfig(seed=5, shuffle=shuffle, io_backend=io_backend, **extra)
    return runtime.cached_dataset([path], reader_config=config)


def _as_tuples(samples: Any) -> list[tuple[Any, ...]]:
    return [(s.data, s.metadata, list(s.metadata), s.cache_id, s.sample_id) for s in samples]


@pytest.mark.parametrize("shuffle", [False, True])
def test_mixed_record_sizes_read_like_get_item(
    runtime: Any, io_backend: str, tmp_path: Path, shuffle: bool
) -> None:
    """Records on both sides of the contiguous-batch threshold, in runs long enough that
    the batch shape switches back and forth, read exactly as ``get_item`` reads them."""
    rng = random.Random(3)
    threshold = dataset_module.CONTIGUOUS_RECORD_BYTES
    records = []
    for i in range(600):
        large = (i // 40) % 2 == 1
        size = rng.randrange(threshold, 3 * threshold) if large else rng.randrange(0, 700)
        records.append((rng.randbytes(size), {"i": i, "large": large, "tag": f"t{i % 3}"}))
    path = _write(runtime, tmp_path, "mixed", records)
    dataset = _open(runtime, path, io_backend, shuffle, prefetch_size=8)
    got = list(dataset)
    assert len(got) == len(records)
    assert all(type(s) is drt.CachedSample and type(s.data) is bytes for s in got)
    want = [dataset.get_item(s.cache_id, s.sample_id) for s in got]
    assert _as_tuples(got) == _as_tuples(want)
    for s in got:
        data, meta = records[s.sample_id]
        assert s.data == data and s.metadata == meta
    if not shuffle:
        assert [s.sample_id for s in got] == list(range(len(records)))


@pytest.mark.parametrize("shuffle", [False, True])
def test_large_payloads_are_read_into_the_bytes_handed_out(
    runtime: Any, io_backend: str, tmp_path: Path, shuffle: bool, monkeypatch: Any
) -> None:
    """Large uncompressed records are read by the backend straight into the ``bytes``
    objects handed out (``_native.PayloadBuffers``): most of them when runs of records
    share a length, none when every length differs; either way every sample equals what
    ``get_item`` reads, keeps its bytes after later reads, and hashes like its copy."""
    from dataset_rt import _native

    rng = random.Random(11)
    least = dataset_module.PAYLOAD_BUFFER_BYTES
    records = []
    for run in range(6):
        size = rng.randrange(least, 4 * least)
        for i in range(30):
            # A run of one length; a small or odd-sized record now and then.
            n = 100 if i == 29 and run % 3 == 0 else size + (i == 20 and run % 2 == 1)
            records.append((rng.randbytes(n), {"i": len(records), "run": run}))
    path = _write(runtime, tmp_path, "large", records)
    taken: list[bool] = []
    take = _native.PayloadBuffers.take

    def counting(self: Any, address: int) -> Any:
        got = take(self, address)
        taken.append(got is not None)
        return got

    take_run = _native.PayloadBuffers.take_run

    def counting_run(self: Any, starts: list[int]) -> Any:
        got = take_run(self, starts)
        taken.extend([True] * len(got or ()))
        return got

    monkeypatch.setattr(_native.PayloadBuffers, "take", counting)
    monkeypatch.setattr(_native.PayloadBuffers, "take_run", counting_run)
    dataset = _open(runtime, path, io_backend, shuffle, prefetch_size=8)
    got = list(dataset)
    assert len(got) == len(records)
    for s in got:
        data, meta = records[s.sample_id]
        assert type(s.data) is bytes and s.data == data and s.metadata == meta
        assert hash(s.data) == hash(bytes(bytearray(s.data)))
    want = [dataset.get_item(s.cache_id, s.sample_id) for s in got]
    assert _as_tuples(got) == _as_tuples(want)
    if not shuffle:
        assert [s.sample_id for s in got] == list(range(len(records)))
        # Runs of one length: many payloads landed in the bytes handed out (not those
        # read ahead, coalesced, before the run's first sample showed its length).
        assert sum(taken) > len(records) // 3, sum(taken)


def test_large_payload_buffers_resume_after_small_records(
    runtime: Any, io_backend: str, tmp_path: Path, monkeypatch: Any
) -> None:
    """A run of small records between runs of large ones: per-sample iteration stops
    giving payload buffers during the small run and starts again after it, so the large
    runs after it, and a change of length among them, are read into the ``bytes`` handed
    out like the first (buffers are counted over the iterator's whole life, not from
    where giving them started again)."""
    from dataset_rt import _native

    rng = random.Random(5)
    size = dataset_module.PAYLOAD_BUFFER_BYTES + 321
    records = []
    runs = [(size, 30), (100, 40), (size + 1000, 60), (size + 2000, 60)]
    for run, (n, count) in enumerate(runs):
        for _ in range(count):
            records.append((rng.randbytes(n), {"i": len(records), "run": run}))
    path = _write(runtime, tmp_path, "resume", records)
    # Payloads taken from given buffers, by length (so by run: the runs' lengths differ).
    taken: Counter[int] = Counter()
    take = _native.PayloadBuffers.take
    take_run = _native.PayloadBuffers.take_run

    def counting(self: Any, address: int) -> Any:
        got = take(self, address)
        if got is not None:
            taken[len(got)] += 1
        return got

    def counting_run(self: Any, starts: list[int]) -> Any:
        got = take_run(self, starts)
        taken.update(map(len, got or ()))
        return got

    monkeypatch.setattr(_native.PayloadBuffers, "take", counting)
    monkeypatch.setattr(_native.PayloadBuffers, "take_run", counting_run)
    # The byte budget pinned: the contiguous batch after the small records takes large
    # ones up to about the budget, whose default follows the machine's last-level cache
    # (12 MiB, 41 large records, on a 48 MiB one).
    dataset = _open(runtime, path, io_backend, False, prefetch_size=8, prefetch_bytes=4 << 20)
    got = list(dataset)
    assert [s.sample_id for s in got] == list(range(len(records)))
    assert all(s.data == records[s.sample_id][0] for s in got)
    # Every large run: most payloads in the bytes handed out (not the first few of a run,
    # read ahead before its first sample showed the new length, nor those that come in
    # the contiguous batch that follows small records).
    assert taken[size] > 15 and taken[size + 1000] > 20 and taken[size + 2000] > 40, taken


def test_large_payload_buffers_cost_one_call_a_batch(
    runtime: Any, io_backend: str, tmp_path: Path, monkeypatch: Any
) -> None:
    """Records alike: topping the payload buffers up costs at most one native call a
    batch once they flow (none to count the assigned ones), and batches whose payloads
    are all in given buffers hand those objects out; samples as ``get_item`` reads."""
    from dataset_rt import _native

    rng = random.Random(3)
    size = dataset_module.PAYLOAD_BUFFER_BYTES + 123
    records = [(rng.randbytes(size), {"i": i}) for i in range(40)]
    path = _write(runtime, tmp_path, "alike", records)
    calls = {"next_batch": 0, "give_payload_buffers": 0}
    runs: list[int] = []
    for name in calls:
        original = getattr(_native.Iterator, name)

        def counted(self: Any, *args: Any, _name: str = name, _original: Any = original) -> Any:
            calls[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(_native.Iterator, name, counted)
    take_run = _native.PayloadBuffers.take_run

    def counting_run(self: Any, starts: list[int]) -> Any:
        got = take_run(self, starts)
        runs.append(len(got or ()))
        return got

    monkeypatch.setattr(_native.PayloadBuffers, "take_run", counting_run)
    dataset = _open(runtime, path, io_backend, False, prefetch_size=8)
    got = list(dataset)
    assert [(s.data, s.metadata) for s in got] == records
    want = [dataset.get_item(s.cache_id, s.sample_id) for s in got]
    assert _as_tuples(got) == _as_tuples(want)
    # The first top-up counts the assigned buffers (two calls); later ones one at most.
    assert calls["give_payload_buffers"] <= calls["next_batch"] + 1, calls
    assert sum(runs) > len(records) // 2, runs


def test_string_columns_of_one_length(runtime: Any, io_backend: str, tmp_path: Path) -> None:
    """String values whose bytes tile a batch like a repeated constant but differ
    (``"a", "", "aa"``: ``"aaa"``), constant values (ASCII, non-ASCII, empty), and
    values of one length that differ: each sample keeps its own value."""
    cases = [["a", "", "aa"], ["train"] * 5, ["tränn"] * 4, [""] * 3, ["ab", "ab", "ba"]]
    records = [(bytes([k]), {"s": value}) for values in cases for k, value in enumerate(values)]
    for k, values in enumerate(cases):
        path = _write(runtime, tmp_path, f"strings{k}", [(b"x", {"s": v}) for v in values])
        dataset = _open(runtime, path, io_backend, shuffle=False)
        assert [s.metadata["s"] for s in dataset] == values
    path = _write(runtime, tmp_path, "strings_all", records)
    dataset = _open(runtime, path, io_backend, shuffle=False)
    assert [s.metadata for s in dataset] == [meta for _, meta in records]


def test_samples_are_made_as_they_are_consumed(
    runtime: Any, io_backend: str, tmp_path: Path
) -> None:
    """A batch's ``CachedSample`` tuples (objects the garbage collector tracks) are made
    one at a time as the consumer takes them, not held in a list for the whole batch:
    with a batch waiting, only the samples taken are alive. Many tracked objects alive
    at once made every collection traverse (and promote) them."""
    records = [(bytes(64), {"label": i % 10}) for i in range(500)]
    path = _write(runtime, tmp_path, "lazy", records)
    dataset = _open(runtime, path, io_backend, shuffle=False, prefetch_size=64)
    it = iter(dataset)
    taken = [next(it) for _ in range(5)]  # the first batch is one sample, then a large one
    gc.collect()
    # This cache's samples only: other tests in the process may keep theirs alive.
    cache_id = taken[0].cache_id
    alive = [o for o in gc.get_objects() if type(o) is drt.CachedSample and o.cache_id == cache_id]
    assert len(alive) == len(taken)
    taken += list(it)
    assert [s.sample_id for s in taken] == list(range(500))


def test_state_counts_samples_taken_within_a_batch(
    runtime: Any, io_backend: str, tmp_path: Path
) -> None:
    """``state_dict`` in the middle of a large contiguous batch points right after the
    last sample handed out."""
    records = [(bytes([i % 256]) * 16, {"label": i}) for i in range(300)]
    path = _write(runtime, tmp_path, "state", records)
    dataset = _open(runtime, path, io_backend, shuffle=False)
    it = iter(dataset)
    for _ in range(123):
        next(it)
    assert dataset.state_dict()["position"] == 123
    again = _open(runtime, path, io_backend, shuffle=False)
    again.load_state_dict(dataset.state_dict())
    assert [s.sample_id for s in again][:5] == [123, 124, 125, 126, 127]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_batch_of_small_records_does_not_size_one_of_large_ones(
    runtime: Any, io_backend: str, tmp_path: Path, shuffle: bool
) -> None:
    """After tiny records the next contiguous batch asks for thousands of samples; when
    large records follow, the byte budget (DRT_BATCH_BOUNDED) stops it, not the count."""
    small = [(bytes([i % 251]) * 64, {"i": i}) for i in range(400)]
    large = [(bytes([i % 251]) * (256 << 10), {"i": 400 + i}) for i in range(64)]
    path = _write(runtime, tmp_path, "small_then_large", small + large)
    budget = 1 << 20
    dataset = _open(runtime, path, io_backend, shuffle, prefetch_size=64, prefetch_bytes=budget)
    batch_bytes: list[int] = []
    samples = dataset._samples

    def recording(batch: Any, *rest: Any) -> Any:
        lengths, _, _ = batch.lengths_and_ids()
        batch_bytes.append(int(lengths.sum()))
        return samples(batch, *rest)

    dataset._samples = recording
    got = [(s.data, s.metadata) for s in dataset]
    records = small + large
    if shuffle:
        assert all(records[m["i"]] == (d, m) for d, m in got)
    else:
        assert got == records
    # At most one record (a read of one 256 KiB record) beyond the budget; unbounded, a
    # batch after the small records would hold all 16 MiB of the large ones.
    assert max(batch_bytes) <= budget + (256 << 10), batch_bytes


def test_samples_do_not_resume_python_per_sample(
    runtime: Any, io_backend: str, tmp_path: Path
) -> None:
    """Per-sample iteration takes each sample from its batch's iterator at C level: the
    Python code that asks for batches runs once a batch, not once a sample (a generator
    delegating with ``yield from`` resumed its frame for every sample)."""
    records = [(bytes([i % 256]) * 16, {"label": i % 10, "split": "train"}) for i in range(2000)]
    path = _write(runtime, tmp_path, "resumes", records)
    dataset = _open(runtime, path, io_backend, shuffle=True)
    resumes = Counter[str]()

    def trace(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == dataset_module.__file__:
            resumes[frame.f_code.co_name] += 1

    it = iter(dataset)
    sys.settrace(trace)
    try:
        got = list(it)
    finally:
        sys.settrace(None)
    again = _open(runtime, path, io_backend, shuffle=True)
    assert _as_tuples(got) == _as_tuples(again)
    # A handful of batches (the first is one sample); each resumes the generator once.
    assert sum(resumes.values()) < 40, resumes


def test_closing_the_sample_stream_closes_the_native_iterator(
    runtime: Any, io_backend: str, tmp_path: Path
) -> None:
    """``close()`` on ``iter(dataset)`` mid-batch ends the stream and gives up the rest of
    its window (as closing a generator did); closing again, or after the end, is a no-op."""
    records = [(bytes(16), {"label": i}) for i in range(50)]
    path = _write(runtime, tmp_path, "close", records)
    dataset = _open(runtime, path, io_backend, shuffle=False)
    dataset.set_epoch_len(20)
    it = iter(dataset)
    assert [next(it).sample_id for _ in range(3)] == [0, 1, 2]
    it.close()
    assert list(it) == []
    it.close()
    assert (dataset.state_dict()["position"], dataset.state_dict()["window_end"]) == (20, 20)
    assert [s.sample_id for s in dataset] == list(range(20, 40))
    done = iter(dataset)
    assert len(list(done)) == 20
    done.close()


@pytest.mark.parametrize(
    ("offsets", "values", "want"),
    [
        ([0, 5, 10, 15], b"traintraintrain", ["train"] * 3),
        ([0, 2, 4, 6], b"ababba", ["ab", "ab", "ba"]),
        ([0, 1, 1, 3], b"aaa", ["a", "", "aa"]),
        ([0, 0, 0], b"", ["", ""]),
        # offsets[0] need not be 0 (drt_column): not a progression from 0.
        ([3, 5, 7], b"xyzababzz", ["ab", "ab"]),
        ([2, 4, 6], b"..ab\xc3\xa4", ["ab", "ä"]),
        ([0, 6, 12], ("tränn" * 2).encode(), ["tränn"] * 2),
    ],
)
def test_string_column_values(offsets: list[int], values: bytes, want: list[str]) -> None:
    """``_column_values`` of string columns: constant columns (one ``str`` object), equal
    lengths that differ, offsets that do not start at 0, non-ASCII values."""
    from dataset_rt import _native
    from dataset_rt._ffi import ffi

    column = ffi.new("drt_column *")
    keep = (ffi.new("uint64_t[]", offsets), ffi.new("uint8_t[]", values or b"\0"))
    column.kind = int(_native.Kind.STRING)
    column.offsets, column.values = keep
    got = _native._column_values(column, int(_native.Kind.STRING), len(offsets) - 1)
    assert got == want
    if len(set(want)) == 1 and offsets[0] == 0:
        assert len({id(v) for v in got}) == 1
