"""Details of the Python API that callers can observe, as dataset-rt 0.4.8 has them
(each expected value below was observed on the reference release): copies, pickling,
the generator protocol of ``iter(dataset)``, argument conversion, ``dump_config``'s
path, and per-source errors for metadata that is not UTF-8 encodable."""

from __future__ import annotations

import copy
import decimal
import os
import pickle
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dataset_rt as drt
from tests.conftest import FIXTURES

SURROGATE_ERROR = (
    "Python error: UnicodeEncodeError: 'utf-8' codec can't encode character '\\udcff' in "
    "position 0: surrogates not allowed"
)


@pytest.fixture
def dataset(runtime: drt.DatasetRuntime) -> drt.CachedDataset:
    return runtime.cached_dataset(
        [FIXTURES / "plain_one_shard"], reader_config=drt.ReaderConfig(seed=1, shuffle=False)
    )


def test_copy_shares_the_dataset_and_pickling_is_refused(
    runtime: drt.DatasetRuntime, dataset: drt.CachedDataset
) -> None:
    other = copy.copy(dataset)
    other.set_epoch_len(3)
    assert len(dataset) == 3
    assert [s.sample_id for s in other] == [0, 1, 2]
    assert [s.sample_id for s in dataset] == [3, 4, 5]  # one stream
    other.update_metadata(dataset.get_metadata().head(4))
    assert (len(dataset), dataset.get_metadata().height) == (4, 4)
    assert copy.copy(runtime).num_workers == runtime.num_workers
    for obj, name in ((runtime, "DatasetRuntime"), (dataset, "CachedDataset")):
        with pytest.raises(TypeError, match=rf"^cannot pickle 'builtins.{name}' object$"):
            pickle.dumps(obj)
    with pytest.raises(TypeError, match=r"^cannot pickle 'builtins.CachedDataset' object$"):
        copy.deepcopy(dataset)


def test_iter_speaks_the_generator_protocol(dataset: drt.CachedDataset) -> None:
    dataset.set_epoch_len(10)
    stream = iter(dataset)
    assert isinstance(stream, Generator)
    with pytest.raises(TypeError, match=r"^can't send non-None value to a just-started"):
        stream.send(1)
    assert [stream.send(None).sample_id, stream.send("ignored").sample_id] == [0, 1]
    with pytest.raises(ValueError, match=r"^x$"):
        stream.throw(ValueError("x"))
    assert list(stream) == []  # closed by the exception
    assert next(iter(dataset)).sample_id == 10  # the thrown-into window was given up
    with pytest.raises(KeyError):
        iter(dataset).throw(KeyError, "k")


@pytest.mark.parametrize("value", [1.5, np.float64(4), decimal.Decimal(3)])
def test_epoch_len_must_be_an_integer(dataset: drt.CachedDataset, value: Any) -> None:
    with pytest.raises(TypeError, match=r"object cannot be interpreted as an integer$"):
        dataset.set_epoch_len(value)
    dataset.set_epoch_len(np.int64(7))
    assert len(dataset) == 7


def test_writer_counts_must_be_integers(runtime: drt.DatasetRuntime, tmp_path: Path) -> None:
    config = drt.WriterConfig.model_construct(
        **{**drt.WriterConfig().model_dump(), "max_shard_bytes": "x"}
    )
    source = _Rows("s", [{}])
    with pytest.raises(RuntimeError) as info:
        runtime.write_cache(source, tmp_path, writer_config=config)
    assert str(info.value) == (
        "Python error: TypeError: 'str' object cannot be interpreted as an integer"
    )
    assert list(tmp_path.iterdir()) == []


def test_dump_config_returns_the_resolved_path(dataset: drt.CachedDataset, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        returned = dataset.dump_config("link")
    finally:
        os.chdir(cwd)
    assert returned == (tmp_path / "real" / "dataset.json").resolve()
    assert returned.is_file()


class _Rows:
    def __init__(self, name: str, rows: list[dict[str, Any]]) -> None:
        self.name = name
        self.rows = rows

    def __iter__(self):
        for i, row in enumerate(self.rows):
            yield drt.CacheInput(b"%d" % i, row)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"\udcff": 1}], SURROGATE_ERROR),  # a key of the first sample
        ([{"a": 1}, {"\udcff": 1}], SURROGATE_ERROR),  # of a later one
        ([{"a": 1, "b": 1}, {"a": 1, "\udcff": 1}], SURROGATE_ERROR),  # same key count
        ([{"a": "\udcff"}], "metadata values must be bool, int, float, or str"),
        ([{"a": "ok"}, {"a": "\udcff"}], "metadata values must be bool, int, float, or str"),
    ],
    ids=["first key", "later key", "later key, same count", "first value", "later value"],
)
def test_metadata_that_is_not_utf8_fails_its_source_only(
    runtime: drt.DatasetRuntime, tmp_path: Path, rows: list[dict[str, Any]], message: str
) -> None:
    bad, good = runtime.write_cache(
        [_Rows("bad", rows), _Rows("good", [{"a": 1}])],
        tmp_path,
        writer_config=drt.WriterConfig(show_progress=False),
    )
    assert bad == drt.CacheWriteError("bad", message)
    assert isinstance(good, drt.CacheWriteSuccess)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "tmp") == ["good"]


def test_parallel_writer_checks_names_with_the_public_rules(
    runtime: drt.DatasetRuntime, tmp_path: Path
) -> None:
    config = drt.WriterConfig(num_processes=2, show_progress=False)
    results = runtime.write_cache(
        [_Rows("", [{}]), _Rows("x" * 256, [{}])], tmp_path, writer_config=config
    )
    assert results == [
        drt.CacheWriteError(
            "source[0]", "CacheSource.name must be a non-reserved plain path segment"
        ),
        drt.CacheWriteError(
            "source[1]", "CacheSource.name exceeds the supported filesystem component limit"
        ),
    ]


def test_sample_stream_refuses_copy_and_pickle(dataset: drt.CachedDataset) -> None:
    """0.4.8's ``iter(dataset)`` is a generator: copying or pickling it raises; a copy of
    ours would share the native iterator with the original (each taking the other's
    samples) without ``close`` or ``throw``."""
    stream = iter(dataset)
    for operation in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match=r"^cannot pickle 'generator' object$"):
            operation(stream)
    assert next(stream).sample_id == 0
