"""Batch metadata comes from each cache's ``metadata.arrow``, not from parsing JSON.

The batch APIs (``iter_batches``, ``get_items``, the range batches the PyTorch adapters
use) gather their metadata columns from the stored ``metadata.arrow`` (``DRT_BATCH_
STORED_METADATA``); per-sample reads parse each record's embedded JSON as the reference
does. For every cache a writer produced both are equal, bit for bit: checked here on
every fixture cache, on a cache of float and integer edge cases, after
``update_metadata`` with edited values (batches keep the stored values), and on both I/O
backends. What differs is documented in docs/compatibility.md: a record whose embedded
JSON is broken fails per-sample reads, while batches (without ``validate_cache``) still
return the stored row; with ``validate_cache=True`` batches parse and compare the JSON
and fail with the per-sample error.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

import dataset_rt as drt
from tests.conftest import FIXTURE_NAMES, FIXTURES


def bits(value: Any) -> Any:
    """A metadata value with floats as their bit patterns (NaN payloads, -0.0 compared)."""
    if type(value) is float:
        return ("float", struct.pack("<d", value))
    return (type(value).__name__, value)


def row_bits(row: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(key, bits(value)) for key, value in row.items()]


def open_dataset(runtime, io_backend: str, paths: list[Path], **options: Any):
    options.setdefault("shuffle", False)
    config = drt.ReaderConfig(seed=4, io_backend=io_backend, **options)
    return runtime.cached_dataset(paths, reader_config=config)


def expect_batches_equal_samples(open_twice) -> int:
    """iter_batches, get_items and the range batches carry exactly the per-sample
    metadata (keys in order, types, floats bit for bit). ``open_twice()`` opens the
    same dataset (the same stream) each time. Returns the samples checked."""
    dataset = open_twice()
    samples = list(dataset)
    want = [row_bits(s.metadata) for s in samples]
    batches = list(open_twice().iter_batches(7))
    got = [row_bits(row) for b in batches for row in b.metadata.to_dicts()]
    assert [(int(c), int(s)) for b in batches for c, s in zip(b.cache_id, b.sample_id)] == [
        (s.cache_id, s.sample_id) for s in samples
    ]
    assert got == want
    # Random access: the same identities in reverse, every one checked against get_item.
    reverse = samples[::-1]
    batch = dataset.get_items([s.cache_id for s in reverse], [s.sample_id for s in reverse])
    items = [dataset.get_item(s.cache_id, s.sample_id) for s in reverse]
    assert [row_bits(r) for r in batch.metadata.to_dicts()] == [row_bits(s.metadata) for s in items]
    assert [row_bits(s.metadata) for s in items] == want[::-1]
    # The range batches of the tensor path (contiguous and gathered into a buffer).
    names = list(samples[0].metadata) if samples else []
    for gathered in (False, True):
        rows: list[list[tuple[str, Any]]] = []
        with dataset._range_batches(0, len(samples)) as batches:
            while True:
                if gathered:
                    raw = batches.next_into(5, np.empty(1 << 16, dtype=np.uint8))
                else:
                    raw = batches.next(5)
                if raw is None:
                    break
                columns = {
                    k: (v.tolist() if isinstance(v, np.ndarray) else list(v))
                    for k, v in raw.columns.items()
                }
                assert list(columns) == names
                for i in range(len(raw.cache_id)):
                    rows.append([(k, bits(columns[k][i])) for k in names])
        # Range positions 0.. of a fresh stream: the first window's order.
        first = [row_bits(s.metadata) for s in dataset._iter_range(0, len(samples))]
        assert rows == first
    return len(samples)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_fixture_cache(runtime, io_backend: str, name: str) -> None:
    for validate in (False, True):
        paths = [FIXTURES / name]

        def open_twice(paths: list[Path] = paths, validate: bool = validate):
            return open_dataset(runtime, io_backend, paths, validate_cache=validate)

        assert expect_batches_equal_samples(open_twice) > 0


def test_fixture_caches_together(runtime, io_backend: str) -> None:
    names = ["plain_one_shard", "plain_many_shards", "lz4_many_shards", "unicode_é_name"]
    paths = [FIXTURES / n for n in names]
    n = expect_batches_equal_samples(lambda: open_dataset(runtime, io_backend, paths, shuffle=True))
    assert n == 120 + 300 + 300 + 10


# Finite floats as our writer stores them; the placeholders become NaN and infinities
# the way 0.4.8 writes those (JSON null, the value in metadata.arrow): see edge_cache.
NAN_PAYLOAD = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0001))[0]
NONFINITE = {1.25: math.nan, 2.25: math.inf, 3.25: -math.inf, 4.25: NAN_PAYLOAD}
EDGE_FLOATS = [
    0.0,
    -0.0,
    0.1,
    -1.5,
    5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    1e16,
    123456789.123456789,
    math.pi,
    *NONFINITE,
]
EDGE_INTS = [0, 1, -1, 2**53 + 1, -(2**53) - 1, 2**63 - 1, -(2**63)]
EDGE_STRINGS = ["", "a", "é中\U0001f600", '"quoted" \\ back\nslash\t', "\x00nul", "x" * 300]


def edge_float(sample_id: int) -> float:
    value = EDGE_FLOATS[sample_id % len(EDGE_FLOATS)]
    return NONFINITE.get(value, value)


class EdgeSource:
    """Records whose metadata covers float, integer, string and bool edge cases."""

    name = "edges"

    def __iter__(self):
        n = len(EDGE_FLOATS) * 3
        for i in range(n):
            yield drt.CacheInput(
                data=bytes([i]) * (i % 5),
                metadata={
                    "f": EDGE_FLOATS[i % len(EDGE_FLOATS)],
                    "i": EDGE_INTS[i % len(EDGE_INTS)],
                    "s": EDGE_STRINGS[i % len(EDGE_STRINGS)],
                    "b": i % 3 == 0,
                },
            )


def _record(cache: Path, sample_id: int) -> tuple[Path, int, int]:
    index = (cache / "index.bin").read_bytes()
    shard_id, offset, length = struct.unpack_from("<QQQ", index, 24 * sample_id)
    manifest = json.loads((cache / "manifest.json").read_text(encoding="utf-8"))
    return cache / "shards" / manifest["shards"][shard_id]["name"], offset, length


def _replace_in_record(cache: Path, sample_id: int, old: bytes, new: bytes) -> None:
    """Replace bytes of a record's embedded JSON (same length)."""
    assert len(old) == len(new)
    path, offset, length = _record(cache, sample_id)
    data = bytearray(path.read_bytes())
    record = bytes(data[offset : offset + length])
    assert old in record, record[:120]
    data[offset : offset + length] = record.replace(old, new, 1)
    path.write_bytes(bytes(data))


def _fix_checksums(cache: Path) -> None:
    """The manifest's SHA-256 of every shard and of metadata.arrow, from the files (so
    validate_cache gets past the checksums of an edited cache)."""
    manifest = json.loads((cache / "manifest.json").read_text(encoding="utf-8"))
    for shard in manifest["shards"]:
        data = (cache / "shards" / shard["name"]).read_bytes()
        shard["sha256"] = hashlib.sha256(data).hexdigest()
    metadata = (cache / "metadata.arrow").read_bytes()
    manifest["metadata_sha256"] = hashlib.sha256(metadata).hexdigest()
    (cache / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")


@pytest.fixture(scope="module")
def edge_cache(tmp_path_factory, runtime) -> Path:
    """A cache of edge-case metadata, in which the NONFINITE placeholders were turned
    into what 0.4.8 writes for NaN and infinities: ``null`` in the embedded JSON, the
    value (bit for bit) in metadata.arrow."""
    import pyarrow as pa

    base = tmp_path_factory.mktemp("edges")
    config = drt.WriterConfig(show_progress=False, max_shard_bytes=256)
    [result] = runtime.write_cache(EdgeSource(), base, writer_config=config)
    assert type(result).__name__ == "CacheWriteSuccess", result
    cache = base / "edges"
    # Read into memory (not mapped): the file is rewritten below.
    table = pa.ipc.open_file(pa.py_buffer((cache / "metadata.arrow").read_bytes())).read_all()
    floats = table.column("f").to_numpy().copy()
    for sid in range(table.num_rows):
        placeholder = EDGE_FLOATS[sid % len(EDGE_FLOATS)]
        if placeholder in NONFINITE:
            _replace_in_record(cache, sid, f'"f":{placeholder}'.encode(), b'"f":null')
            floats[sid] = NONFINITE[placeholder]
    column = table.schema.get_field_index("f")
    table = table.set_column(column, table.schema.field(column), pa.array(floats))
    with pa.OSFile(str(cache / "metadata.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    _fix_checksums(cache)
    return cache


def test_float_and_integer_edge_cases(runtime, io_backend: str, edge_cache: Path) -> None:
    for validate in (False, True):

        def open_twice(validate: bool = validate):
            return open_dataset(runtime, io_backend, [edge_cache], validate_cache=validate)

        assert expect_batches_equal_samples(open_twice) == 3 * len(EDGE_FLOATS)
        # And the values are the written ones (NaN payloads and infinities included).
        dataset = open_twice()
        n = len(dataset)
        batch = dataset.get_items([_cache_id(dataset)] * n, list(range(n)))
        assert n == 3 * len(EDGE_FLOATS)
        for sid, row in enumerate(batch.metadata.to_dicts()):
            assert bits(row["f"]) == bits(edge_float(sid))
            assert row["i"] == EDGE_INTS[sid % len(EDGE_INTS)]
            assert row["s"] == EDGE_STRINGS[sid % len(EDGE_STRINGS)]
            assert row["b"] == (sid % 3 == 0)


def test_batches_return_stored_values_after_update_metadata(
    runtime, io_backend: str, edge_cache: Path
) -> None:
    """The active table may hold edited values; batches return metadata.arrow as
    written, like get_item (the embedded JSON)."""
    dataset = open_dataset(runtime, io_backend, [edge_cache], shuffle=False)
    cid = _cache_id(dataset)
    stored = {sid: row_bits(dataset.get_item(cid, sid).metadata) for sid in range(len(dataset))}
    frame = dataset.get_metadata()
    edited = frame.with_columns(
        pl.lit(7.25).alias("f"), pl.lit(-9, dtype=pl.Int64).alias("i"), pl.lit("edited").alias("s")
    ).reverse()
    dataset.update_metadata(edited)
    seen = 0
    for b in dataset.iter_batches(4):
        for sid, row in zip(b.sample_id.tolist(), b.metadata.to_dicts()):
            assert row_bits(row) == stored[sid]
            seen += 1
    assert seen == len(stored)
    # get_item (the embedded JSON) is unaffected as well.
    assert {sid: row_bits(dataset.get_item(cid, sid).metadata) for sid in stored} == stored
    ids = list(stored)
    batch = dataset.get_items([cid] * len(ids), ids)
    assert [row_bits(r) for r in batch.metadata.to_dicts()] == [stored[i] for i in ids]


def _cache_id(dataset) -> int:
    return int(dataset.get_metadata()["cache_id"][0])


def _edit_record_json(cache: Path, sample_id: int, old: bytes, new: bytes) -> None:
    _replace_in_record(cache, sample_id, old, new)
    _fix_checksums(cache)


def test_broken_embedded_json(runtime, io_backend: str, fixture_copy) -> None:
    """Per-sample reads parse the JSON (the reference's error); batches without
    validate_cache take the stored row; with validate_cache they fail like per-sample."""
    path = fixture_copy("plain_one_shard")
    _edit_record_json(path, 5, b'"label":', b'"label"!')
    dataset = open_dataset(runtime, io_backend, [path])
    cid = _cache_id(dataset)
    with pytest.raises(RuntimeError, match=r"^JSON error: ") as per_sample:
        dataset.get_item(cid, 5)
    batch = dataset.get_items([cid], [5])
    stored = pl.read_ipc(path / "metadata.arrow").row(5, named=True)
    assert batch.metadata.row(0, named=True) == stored
    assert sum(len(b) for b in dataset.iter_batches(64)) == 120

    strict = open_dataset(runtime, io_backend, [path], validate_cache=True)
    with pytest.raises(RuntimeError) as batch_error:
        strict.get_items([cid, cid], [4, 5])
    with pytest.raises(RuntimeError) as item_error:
        strict.get_item(cid, 5)
    assert str(batch_error.value) == str(item_error.value) == str(per_sample.value)
    with pytest.raises(RuntimeError) as iter_error:
        for _ in strict.iter_batches(64):
            pass
    assert str(iter_error.value) == str(item_error.value)


def test_changed_json_value_batches_keep_the_stored_row(
    runtime, io_backend: str, fixture_copy
) -> None:
    """A record whose JSON holds another (valid) value: per-sample returns the JSON's,
    batches the stored row's; validate_cache rejects both the same way."""
    path = fixture_copy("plain_one_shard")
    stored = pl.read_ipc(path / "metadata.arrow")
    label = stored["label"][9]
    old = f'"label":{label},'.encode()
    new_label = -2 if label == -1 else (label + 1 if 0 <= label < 9 else label - 1)
    new = f'"label":{new_label},'.encode()
    _edit_record_json(path, 9, old, new)
    dataset = open_dataset(runtime, io_backend, [path])
    cid = _cache_id(dataset)
    assert dataset.get_item(cid, 9).metadata["label"] == new_label
    assert dataset.get_items([cid], [9]).metadata["label"].to_list() == [label]
    strict = open_dataset(runtime, io_backend, [path], validate_cache=True)
    message = "embedded metadata does not match metadata.arrow for sample 9"
    with pytest.raises(ValueError, match=message):
        strict.get_item(cid, 9)
    with pytest.raises(ValueError, match=message):
        strict.get_items([cid], [9])


class _Library:
    """``_native.lib`` with ``drt_column_string_views`` counted, or refused with
    ``DRT_E_OVERFLOW`` (``overflow``), everything else the library's."""

    def __init__(self, lib: Any, overflow: bool) -> None:
        self._lib = lib
        self._overflow = overflow
        self.view_calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def drt_column_string_views(self, *args: Any) -> int:
        self.view_calls += 1
        if self._overflow:
            return int(drt._native.Status.E_OVERFLOW)
        return self._lib.drt_column_string_views(*args)


@pytest.mark.parametrize("without", ["pyarrow without them", "32-bit view offsets exceeded"])
def test_string_columns_reach_polars_as_views_or_offsets_alike(
    runtime, edge_cache: Path, monkeypatch: pytest.MonkeyPatch, without: str
) -> None:
    """Batch string columns go to Polars as Arrow string views built natively
    (``drt_column_string_views``: inline up to 12 bytes, longer ones by offset), which
    Polars takes without converting; without them (a pyarrow that cannot build them from
    buffers, or a column whose bytes pass 32-bit view offsets) as ``large_string``. The
    frames are equal either way, on the edge cache's empty, short, 12-plus-byte,
    non-ASCII and NUL-holding strings."""
    from dataset_rt import _native

    def frames() -> tuple[list[pl.DataFrame], pl.DataFrame]:
        dataset = open_dataset(runtime, "threads", [edge_cache])
        n = len(dataset)
        ids = list(range(n))[::-1]
        return [b.metadata for b in dataset.iter_batches(7)], dataset.get_items(
            [_cache_id(dataset)] * n, ids
        ).metadata

    counted = _Library(_native.lib, overflow=False)
    monkeypatch.setattr(_native, "lib", counted)
    with_views = frames()
    assert counted.view_calls > 0
    if without == "pyarrow without them":
        monkeypatch.setattr(_native, "_string_view_type", lambda: None)
    else:
        monkeypatch.setattr(_native, "lib", _Library(counted._lib, overflow=True))
    batches, items = frames()
    assert len(batches) == len(with_views[0])
    for got, want in zip(batches, with_views[0]):
        assert got.schema == want.schema and got.equals(want)
    assert items.schema == with_views[1].schema and items.equals(with_views[1])
    assert (
        items["s"].to_list()
        == [EDGE_STRINGS[sid % len(EDGE_STRINGS)] for sid in range(len(items))][::-1]
    )


# ---------------------------------------------------------- frames sliced from chunks


def _own_frames(dataset) -> Any:
    """``dataset`` with every batch taking its own frame (no chunks of stored rows)."""
    dataset._frames._enabled = False
    return dataset


def _count_frames(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the frames built from native columns (a batch's own, or a chunk)."""
    from dataset_rt import dataset as dataset_module

    built = [0]
    build = dataset_module._metadata_frame

    def counted(batch: Any, columns: Any) -> Any:
        built[0] += 1
        return build(batch, columns)

    monkeypatch.setattr(dataset_module, "_metadata_frame", counted)
    return built


def _expect_same_frames(got: list[pl.DataFrame], want: list[pl.DataFrame]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.schema == b.schema
        assert [row_bits(r) for r in a.to_dicts()] == [row_bits(r) for r in b.to_dicts()]


@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_ordered_batches_slice_chunks_of_stored_rows(
    runtime, io_backend: str, batch_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ordered batches (one run of a cache's consecutive samples each) take their frames
    as slices of chunks of stored rows read once for many batches; the frames are the
    batches' own, bit for bit, across cache ends, chunk ends, copy=True and copy=False,
    and for get_items asked for ids in order."""
    names = ["plain_one_shard", "plain_many_shards", "lz4_many_shards", "unicode_é_name"]
    paths = [FIXTURES / n for n in names]
    want = {
        copy: [
            b.metadata
            for b in _own_frames(open_dataset(runtime, io_backend, paths)).iter_batches(
                batch_size, copy=copy
            )
        ]
        for copy in (True, False)
    }
    built = _count_frames(monkeypatch)
    for copy in (True, False):
        built[0] = 0
        got = [
            b.metadata
            for b in open_dataset(runtime, io_backend, paths).iter_batches(batch_size, copy=copy)
        ]
        _expect_same_frames(got, want[copy])
        # Chunks of up to 16 batches' rows: the first batch of each cache, and a batch
        # across two caches, take their own frames; the rest come from a few chunks.
        assert built[0] < (len(got) if batch_size > 7 else len(got) / 2), (built, len(got))
    # get_items in order, call after call (a sequential sampler's batches).
    dataset = open_dataset(runtime, io_backend, paths[:1])
    cid = _cache_id(dataset)
    own = _own_frames(open_dataset(runtime, io_backend, paths[:1]))
    requests = [list(range(s, min(s + batch_size, 120))) for s in range(0, 120, batch_size)]
    want_items = [own.get_items([cid] * len(ids), ids).metadata for ids in requests]
    built[0] = 0
    for copy in (True, False):
        got = [dataset.get_items([cid] * len(ids), ids, copy=copy).metadata for ids in requests]
        _expect_same_frames(got, want_items)
    calls = 2 * len(requests)
    assert built[0] < (calls if batch_size > 7 else calls / 4), (built, calls)
    assert dataset._frames._chunk is not None


def test_random_batches_and_validate_cache_take_their_own_frames(
    runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks are read only for runs that continue the previous one: shuffled batches,
    random get_items and datasets with validate_cache (which compares every record's
    JSON) build each batch's frame from its own columns and never read one."""
    path = FIXTURES / "plain_many_shards"
    shuffled = open_dataset(runtime, "threads", [path], shuffle=True)
    strict = open_dataset(runtime, "threads", [path], validate_cache=True)
    built = _count_frames(monkeypatch)
    batches = list(shuffled.iter_batches(16)) + list(strict.iter_batches(16))
    cid = _cache_id(shuffled)
    items = [shuffled.get_items([cid] * 3, [s, s + 1, s + 2]) for s in (200, 10, 150, 90)]
    assert built[0] == len(batches) + len(items)
    assert shuffled._frames._chunk is None and strict._frames._chunk is None


def test_a_chunk_is_bounded_by_bytes_and_batches(runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk holds at most _CHUNK_BATCHES batches' rows and about _CHUNK_BYTES (from
    the bytes a row took in the previous chunk); a budget too small for _CHUNK_BATCHES_MIN
    batches reads no chunk at all."""
    from dataset_rt import dataset as dataset_module

    path = FIXTURES / "plain_many_shards"
    sizes: list[int] = []
    dataset = open_dataset(runtime, "threads", [path])
    for _batch in dataset.iter_batches(5):
        chunk = dataset._frames._chunk
        if chunk is not None:
            sizes.append(chunk[2] - chunk[1])
    assert sizes and max(sizes) == dataset_module._CHUNK_BATCHES * 5
    row_bytes = dataset._frames._row_bytes
    assert 8 <= row_bytes <= 200
    # A byte budget of about 6 batches' rows (rows differ in size: each chunk is sized
    # from the bytes a row took in the previous one).
    budget = row_bytes * 30
    monkeypatch.setattr(dataset_module, "_CHUNK_BYTES", budget)
    dataset = open_dataset(runtime, "threads", [path])
    dataset._frames._row_bytes = row_bytes
    sizes = []
    for _batch in dataset.iter_batches(5):
        chunk = dataset._frames._chunk
        if chunk is not None:
            sizes.append(chunk[2] - chunk[1])
            assert chunk[3].estimated_size() <= 1.5 * budget
    assert sizes and max(sizes) < dataset_module._CHUNK_BATCHES * 5 / 2
    # Under 4 batches' rows: none.
    monkeypatch.setattr(dataset_module, "_CHUNK_BYTES", row_bytes * 19)
    dataset = open_dataset(runtime, "threads", [path])
    dataset._frames._row_bytes = row_bytes
    assert all(len(b) and dataset._frames._chunk is None for b in dataset.iter_batches(5))


def test_chunks_are_kept_for_later_epochs_within_their_budget(
    runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later epoch's ordered batches slice the chunks the first one read (no stored
    rows read again), with frames equal to the batches' own; the kept chunks never take
    more than _CHUNK_KEEP_BYTES, the least recently used going first."""
    from dataset_rt import dataset as dataset_module

    path = FIXTURES / "plain_many_shards"
    want = [
        b.metadata for b in _own_frames(open_dataset(runtime, "threads", [path])).iter_batches(5)
    ]
    dataset = open_dataset(runtime, "threads", [path])
    built = _count_frames(monkeypatch)
    first = [b.metadata for b in dataset.iter_batches(5)]
    chunks = built[0]
    frames = dataset._frames
    assert len(frames._kept) >= 2
    assert frames._kept_bytes == sum(nbytes for _, nbytes in frames._kept.values())
    built[0] = 0
    second = [b.metadata for b in dataset.iter_batches(5)]
    # Only the first batch (which continues no run) takes its own frame.
    assert built[0] == 1, (built, chunks)
    _expect_same_frames(first, want)
    _expect_same_frames(second, want)
    # A budget of about two chunks: the first epoch's early chunks are dropped (so a
    # later epoch reads them again), and the total stays within the budget.
    budget = 2 * max(nbytes for _, nbytes in frames._kept.values())
    monkeypatch.setattr(dataset_module, "_CHUNK_KEEP_BYTES", budget)
    dataset = open_dataset(runtime, "threads", [path])
    for _ in range(2):
        built[0] = 0
        got = []
        for b in dataset.iter_batches(5):
            got.append(b.metadata)
            assert dataset._frames._kept_bytes <= budget
        _expect_same_frames(got, want)
        assert dataset._frames._kept
        assert built[0] > 1
    assert len(dataset._frames._kept) <= 2
    # Nothing kept with no budget.
    monkeypatch.setattr(dataset_module, "_CHUNK_KEEP_BYTES", 0)
    dataset = open_dataset(runtime, "threads", [path])
    _expect_same_frames([b.metadata for b in dataset.iter_batches(5)], want)
    assert not dataset._frames._kept and dataset._frames._kept_bytes == 0


def test_arrow_nulls_in_stored_rows_take_the_embedded_json(
    runtime, io_backend: str, fixture_copy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metadata.arrow row holding an Arrow null (never written by a writer) takes the
    record's embedded JSON in batches, as per-sample reads do: a chunk of stored rows
    stops before it, and the batches that hold it build their own frames. The metadata
    table (``get_metadata``) rejects the file."""
    import pyarrow as pa

    path = fixture_copy("plain_one_shard")
    table = pa.ipc.open_file(pa.py_buffer((path / "metadata.arrow").read_bytes())).read_all()
    nulls = {30, 31, 77}
    labels = [None if i in nulls else v for i, v in enumerate(table.column("label").to_pylist())]
    index = table.schema.get_field_index("label")
    table = table.set_column(
        index, pa.field("label", pa.int64(), nullable=True), pa.array(labels, pa.int64())
    )
    with pa.OSFile(str(path / "metadata.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    _fix_checksums(path)
    dataset = open_dataset(runtime, io_backend, [path])
    want = [row_bits(s.metadata) for s in dataset]
    assert all(want[i][1][1][1] is not None for i in nulls)  # the JSON's labels
    for size in (1, 4, 25):
        got = [row_bits(r) for b in dataset.iter_batches(size) for r in b.metadata.to_dicts()]
        assert got == want
    # The metadata table refuses it, as 0.4.8's get_metadata does.
    with pytest.raises(RuntimeError, match="Column 'label' is declared as non-nullable but"):
        dataset.get_metadata()
    cid = next(iter(dataset)).cache_id
    for start in range(0, 120, 10):
        ids = list(range(start, start + 10))
        got = [row_bits(r) for r in dataset.get_items([cid] * 10, ids).metadata.to_dicts()]
        assert got == want[start : start + 10]
