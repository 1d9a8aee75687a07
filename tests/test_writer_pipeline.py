"""The writer pipeline: bytes independent of worker count and prefetch size; throughput
knobs never change the cache."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import dataset_rt as drt


class Mixed:
    name = "mixed"

    def __iter__(self):
        for i in range(3000):
            size = (i * 7919) % 3000
            yield drt.CacheInput(
                hashlib.sha256(str(i).encode()).digest() * (size // 32 + 1),
                {"i": i, "x": i / 7, "s": f"s{i % 13}é", "b": i % 3 == 0},
            )


def tree_digest(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name != "metadata.arrow"
    }


@pytest.mark.parametrize("algo", ["none", "lz4"])
def test_bytes_do_not_depend_on_workers_or_prefetch(tmp_path: Path, algo: str) -> None:
    digests = []
    for workers, prefetch in [(1, 1), (2, 7), (4, 64), (4, 5000)]:
        runtime = drt.DatasetRuntime(num_workers=workers)
        config = drt.WriterConfig(
            prefetch_size=prefetch,
            max_shard_bytes=100_000,
            show_progress=False,
            shard_compression=drt.ShardCompression(algo=algo),
        )
        [result] = runtime.write_cache(
            Mixed(), tmp_path / f"{workers}-{prefetch}", writer_config=config
        )
        assert isinstance(result, drt.CacheWriteSuccess), result
        digests.append(tree_digest(result.path))
    assert all(d == digests[0] for d in digests[1:])
    assert len([k for k in digests[0] if k.startswith("shards/")]) > 2


def test_failure_in_a_later_batch_publishes_nothing(tmp_path: Path) -> None:
    class Bad:
        name = "bad"

        def __iter__(self):
            for i in range(1000):
                yield drt.CacheInput(b"x" * 100, {"x": float("nan") if i == 777 else 1.0})

    runtime = drt.DatasetRuntime(num_workers=4)
    [result] = runtime.write_cache(
        Bad(), tmp_path, writer_config=drt.WriterConfig(prefetch_size=16, show_progress=False)
    )
    assert result == drt.CacheWriteError("bad", "metadata field 'x' must be a finite float")
    assert not (tmp_path / "bad").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_batches_stay_within_the_byte_bound_when_records_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small records size batches up to thousands of samples; when the source switches to
    large records, a batch still holds at most BATCH_BYTES_MAX plus one prefetch step."""
    from dataset_rt import writer as writer_module

    flushed: list[tuple[int, int]] = []
    flush = writer_module._Ingest._flush

    def recording_flush(self, payloads, rows, *args):  # type: ignore[no-untyped-def]
        flushed.append((len(payloads), sum(map(len, payloads))))
        return flush(self, payloads, rows, *args)

    monkeypatch.setattr(writer_module._Ingest, "_flush", recording_flush)
    big = 1 << 20

    class Growing:
        name = "growing"

        def __iter__(self):
            for i in range(20_000):
                yield drt.CacheInput(b"s" * 16, {"i": i})
            for i in range(40):
                yield drt.CacheInput(bytes([i]) * big, {"i": 20_000 + i})

    prefetch = 8
    runtime = drt.DatasetRuntime(num_workers=2)
    [result] = runtime.write_cache(
        Growing(),
        tmp_path,
        writer_config=drt.WriterConfig(prefetch_size=prefetch, show_progress=False),
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    assert sum(count for count, _ in flushed) == 20_040
    assert max(count for count, _ in flushed) > 1000  # small records: big batches
    bound = writer_module.BATCH_BYTES_MAX + prefetch * big
    assert max(nbytes for _, nbytes in flushed) <= bound
    dataset = runtime.cached_dataset(
        [result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False)
    )
    samples = list(dataset)
    assert len(samples) == 20_040
    assert samples[-1].data == bytes([39]) * big


class _Faulty:
    """200 good samples with faults at given positions (several per pulled step)."""

    def __init__(self, faults: dict[int, str]) -> None:
        self.name = "faulty"
        self.faults = faults

    def __iter__(self):
        for i in range(200):
            fault = self.faults.get(i)
            metadata = {"n": i, "s": "ok", "f": 0.5}
            if fault == "int64":
                metadata["n"] = 2**63
            elif fault == "surrogate":
                metadata["s"] = "\ud800"
            elif fault == "nan":
                metadata["f"] = float("nan")
            elif fault == "kind":
                metadata["f"] = "x"
            elif fault == "missing":
                del metadata["s"]
                metadata["t"] = "ok"
            elif fault == "not a tuple":
                yield [b"x", metadata]
                continue
            elif fault == "payload":
                yield drt.CacheInput("text", metadata)
            elif fault == "raise":
                raise RuntimeError("source broke")
            yield drt.CacheInput(b"x" * (i % 7), metadata)


@pytest.mark.parametrize("first", ["int64", "surrogate", "nan", "kind", "missing", "payload"])
@pytest.mark.parametrize("later", ["not a tuple", "missing", "int64", "surrogate", "raise"])
def test_each_sample_is_checked_before_the_next(tmp_path: Path, first: str, later: str) -> None:
    """Whatever is wrong with a later sample of the same step or batch, the error is the
    first bad sample's, exactly as when that sample is the only bad one."""
    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(prefetch_size=16, show_progress=False)
    [alone] = runtime.write_cache(_Faulty({70: first}), tmp_path / "a", writer_config=config)
    assert isinstance(alone, drt.CacheWriteError), alone
    for offset in (1, 5, 40):  # same step, same batch, a later batch
        [both] = runtime.write_cache(
            _Faulty({70: first, 70 + offset: later}), tmp_path / "b", writer_config=config
        )
        assert both == alone, (offset, both)
        assert not (tmp_path / "b" / "faulty").exists()


class _AlwaysEqual(str):
    """A str subclass that claims to equal anything (list.count cannot be trusted)."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = str.__hash__


class _Columns:
    """Fixed-size and empty payloads, constant string columns (ASCII, non-ASCII, empty)
    and a column whose second value only pretends to equal the first."""

    name = "columns"

    def __iter__(self):
        for i in range(5000):
            yield drt.CacheInput(
                b"" if i >= 4000 else bytes([i % 251]) * 64,
                {
                    "split": "train",
                    "lang": "é" if i < 2500 else "ü",
                    "empty": "",
                    "odd": _AlwaysEqual("other") if i % 2 else "same",
                },
            )


def test_constant_strings_and_fixed_size_payloads_are_written_exactly(tmp_path: Path) -> None:
    """The writer's shortcuts for constant string columns and fixed-size payloads keep
    every value, in the records and in metadata.arrow, for any batch split."""
    import pyarrow as pa

    from dataset_rt import writer as writer_module

    assert writer_module._constant_strings(["é", "é"])[0] == "éé".encode()
    assert writer_module._constant_strings(["a", _AlwaysEqual("b")]) is None
    assert writer_module._constant_strings(["\ud800", "\ud800"]) is None
    # Contents decide, not __eq__ or the type: a subclass holding the same text is the same
    # value; a NUL in the first value leaves the column to the general path.
    assert writer_module._constant_strings(["a", _AlwaysEqual("a")])[0] == b"aa"
    assert writer_module._constant_strings(["a\0", "a\0"]) is None
    assert writer_module._constant_strings(["a", "a\0a"]) is None
    assert writer_module._all_exactly(int, [1, 2]) and writer_module._all_exactly(int, [])
    assert not writer_module._all_exactly(int, [1, True])
    assert writer_module._uniform_length([3, 3, 3]) == 3
    assert writer_module._uniform_length([3, 4, 3]) is None

    expected = list(_Columns())
    digests = []
    for prefetch in (1, 64, 5000):
        runtime = drt.DatasetRuntime(num_workers=2)
        config = drt.WriterConfig(prefetch_size=prefetch, show_progress=False)
        [result] = runtime.write_cache(_Columns(), tmp_path / str(prefetch), writer_config=config)
        assert isinstance(result, drt.CacheWriteSuccess), result
        digests.append(tree_digest(result.path))
        dataset = runtime.cached_dataset(
            [result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False)
        )
        samples = list(dataset)
        assert len(samples) == len(expected)
        table = pa.ipc.open_file(result.path / "metadata.arrow").read_all()
        rows = table.to_pylist()
        # (the first few mismatches only: pytest's diff of 5,000 rows takes minutes)
        wrong = [
            i
            for i, (sample, row, e) in enumerate(zip(samples, rows, expected))
            if sample.data != e.data
            or sample.metadata != {k: str(v) for k, v in e.metadata.items()}
            or row != {k: str(v) for k, v in e.metadata.items()}
        ]
        assert wrong[:5] == [], (prefetch, len(wrong))
    assert all(d == digests[0] for d in digests[1:])


class _KeySets:
    """CacheInput samples (the writer's bulk path) whose metadata keys change in a later
    prefetch step: one row with a renamed key, then one with an extra key."""

    name = "keysets"

    def __init__(self, renamed: int | None, extra: int | None) -> None:
        self.renamed = renamed
        self.extra = extra

    def __iter__(self):
        for i in range(300):
            row: dict[str, object] = {"a": i, "s": "x"}
            if i == self.renamed:
                row = {"a": i, "t": "x"}
            if i == self.extra:
                row["t"] = "y"
            yield drt.CacheInput(b"p" * 16, row)


@pytest.mark.parametrize(
    ("renamed", "extra", "message"),
    [
        (None, 140, "metadata keys must be identical for every sample"),
        (130, 140, "metadata field 's' is missing"),
        (140, 130, "metadata keys must be identical for every sample"),
    ],
    ids=["extra_key", "renamed_first", "extra_first"],
)
def test_bulk_path_refuses_other_key_sets_in_sample_order(
    tmp_path: Path, renamed: int | None, extra: int | None, message: str
) -> None:
    """The bulk path's key-set check (every schema key found, then the rows' total size)
    reports the first sample whose keys differ, as a sample-by-sample check does."""
    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(prefetch_size=64, show_progress=False)
    [result] = runtime.write_cache(_KeySets(renamed, extra), tmp_path, writer_config=config)
    assert result == drt.CacheWriteError("keysets", message)
    assert not (tmp_path / "keysets").exists()


def test_metadata_columns_keep_every_value_on_each_conversion_path(tmp_path: Path) -> None:
    """Int columns of small non-negative values (converted with ``bytes()``), with values
    outside 0..255 (``np.fromiter``: negatives, large, the int64 bounds; first or last in
    a batch), bools and floats: the records and metadata.arrow hold exactly the values
    the source yielded."""
    import pyarrow as pa

    big = [-(2**63), 2**63 - 1, -1, 256, 255, 0, 10**12]

    def label(i: int) -> int:
        if i < 700:
            return i % 256  # whole batches of small values
        if i % 97 == 0:
            return big[(i // 97) % len(big)]
        return i % 10

    expected = [{"n": label(i), "b": i % 3 == 0, "x": i / 3 - 100.25} for i in range(2000)]
    expected[-1]["n"] = 2**63 - 1  # last value of the last batch
    expected[1000]["n"] = -5

    class Source:
        name = "conversions"

        def __iter__(self):
            for i, metadata in enumerate(expected):
                yield drt.CacheInput(i.to_bytes(4, "little"), dict(metadata))

    runtime = drt.DatasetRuntime(num_workers=2)
    [result] = runtime.write_cache(
        Source(), tmp_path, writer_config=drt.WriterConfig(prefetch_size=50, show_progress=False)
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    dataset = runtime.cached_dataset(
        [result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False)
    )
    samples = list(dataset)
    assert [s.metadata for s in samples] == expected
    assert [type(s.metadata["n"]) for s in samples] == [int] * len(expected)
    with pa.memory_map(str(result.path / "metadata.arrow")) as source:
        table = pa.ipc.open_file(source).read_all()
    assert table.column("n").to_pylist() == [m["n"] for m in expected]
    assert table.column("b").to_pylist() == [m["b"] for m in expected]
    assert table.column("x").to_pylist() == [m["x"] for m in expected]


# A source may refill one buffer and one dict for every sample: 0.4.8 takes each sample's
# bytes and values when it is yielded, so the cache holds what was yielded, not what the
# objects hold later.
REUSE_CONFIGS = {
    "default": {},
    "prefetch_1": {"prefetch_size": 1},
    "lz4": {"shard_compression": drt.ShardCompression(algo="lz4")},
    "profiler": {"profiler": "enabled"},
}


@pytest.mark.parametrize("settings", REUSE_CONFIGS.values(), ids=REUSE_CONFIGS.keys())
@pytest.mark.parametrize(
    "kind", ["bytearray", "numpy_large", "memoryview_slices", "bytes", "bytearray_resized"]
)
def test_reused_buffers_and_dicts_are_taken_when_yielded(
    tmp_path: Path, settings: dict, kind: str
) -> None:
    import numpy as np

    count, size = 300, (100_000 if kind in ("numpy_large", "bytearray_resized") else 8)

    class Reuse:
        name = "reuse"

        def __iter__(self):
            buffer = np.zeros(size, dtype=np.uint8) if kind == "numpy_large" else bytearray(size)
            row: dict = {}
            for i in range(count):
                if kind == "numpy_large":
                    buffer[:] = i % 251
                else:
                    buffer[:] = bytes([i % 251]) * size
                row["i"] = i
                row["s"] = f"s{i}"
                if kind == "bytearray_resized":
                    # Resized in place: no view of it may be left when the source runs.
                    buffer[:] = bytes([i % 251]) * (size - i % 3)
                    data = buffer
                elif kind == "memoryview_slices":
                    data = memoryview(buffer)[: size - i % 3]
                elif kind == "bytes":
                    data = bytes(buffer)
                else:
                    data = buffer
                yield drt.CacheInput(data, row)

    if settings.get("profiler"):
        profiler = drt.WriterProfilerConfig(enabled=True, path=tmp_path / "profile.json")
        settings = {**settings, "profiler": profiler}
    config = drt.WriterConfig(show_progress=False, **settings)
    runtime = drt.DatasetRuntime(num_workers=2)
    [result] = runtime.write_cache(Reuse(), tmp_path / "base", writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    dataset = runtime.cached_dataset(
        [result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False)
    )
    samples = list(dataset)
    assert [s.metadata for s in samples] == [{"i": i, "s": f"s{i}"} for i in range(count)]
    for i, sample in enumerate(samples):
        length = size - i % 3 if kind in ("memoryview_slices", "bytearray_resized") else size
        assert sample.data == bytes([i % 251]) * length, i
    assert dataset.get_metadata()["i"].to_list() == list(range(count))


@pytest.mark.parametrize(("prefetch", "fail_at"), [(64, 64), (64, 768), (1, 1), (1, 5), (7, 14)])
def test_a_source_failing_at_a_step_boundary_reports_its_own_error(
    tmp_path: Path, prefetch: int, fail_at: int
) -> None:
    class Boundary:
        name = "boundary"

        def __iter__(self):
            for i in range(fail_at):
                yield drt.CacheInput(b"x" * 10, {"i": i})
            raise RuntimeError(f"failed after {fail_at}")

    class Good:
        def __init__(self, name: str) -> None:
            self.name = name

        def __iter__(self):
            yield drt.CacheInput(b"y", {"i": 0})

    config = drt.WriterConfig(show_progress=False, prefetch_size=prefetch)
    runtime = drt.DatasetRuntime(num_workers=2)
    results = runtime.write_cache(
        [Good("a"), Boundary(), Good("c")], tmp_path / "base", writer_config=config
    )
    assert results == [
        drt.CacheWriteSuccess("a", tmp_path / "base" / "a"),
        drt.CacheWriteError("boundary", f"Python error: RuntimeError: failed after {fail_at}"),
        drt.CacheWriteSuccess("c", tmp_path / "base" / "c"),
    ]


def test_subclass_values_are_stored_as_their_raw_value(tmp_path: Path) -> None:
    """``str``, ``int`` and ``float`` subclasses (a ``(str, Enum)``, ``IntEnum``, classes
    overriding ``__str__``/``__int__``/``__float__``) store the value they hold, as 0.4.8
    does, on every sample (the first ones are checked one by one, later ones in bulk)."""
    import enum

    class Split(str, enum.Enum):
        TRAIN = "train"
        VAL = "val"

    class Loud(str):
        def __str__(self) -> str:
            return "OVERRIDE"

    class Odd(int):
        def __int__(self) -> int:
            return 999

        def __index__(self) -> int:
            return 999

    class Shifted(float):
        def __float__(self) -> float:
            return 9.5

    class Subclasses:
        name = "sub"

        def __iter__(self):
            for i in range(300):
                split = Split.TRAIN if i % 2 else Split.VAL
                yield drt.CacheInput(
                    b"x", {"split": split, "s": Loud(f"raw{i}"), "n": Odd(i), "f": Shifted(i / 4)}
                )

    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(show_progress=False)
    [result] = runtime.write_cache(Subclasses(), tmp_path / "base", writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    dataset = runtime.cached_dataset(
        [result.path], reader_config=drt.ReaderConfig(seed=0, shuffle=False)
    )
    expected = [
        {"f": i / 4, "n": i, "s": f"raw{i}", "split": "train" if i % 2 else "val"}
        for i in range(300)
    ]
    assert [s.metadata for s in dataset] == expected
    assert dataset.get_metadata().select(["f", "n", "s", "split"]).to_dicts() == expected
