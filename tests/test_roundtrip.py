"""Property test: whatever is written reads back identical (floats bit for bit)."""

from __future__ import annotations

import math
import struct
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dataset_rt as drt

keys = st.text(min_size=1, max_size=8).filter(
    lambda k: k not in ("cache_id", "sample_id", "weight")
)
kinds = st.sampled_from(["bool", "int", "float", "str"])
values = {
    "bool": st.booleans(),
    "int": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "float": st.floats(allow_nan=False, allow_infinity=False),
    "str": st.text(max_size=20),
}


@st.composite
def sources(draw):
    schema = draw(st.dictionaries(keys, kinds, min_size=1, max_size=5))
    rows = draw(
        st.lists(
            st.tuples(
                st.binary(max_size=300),
                st.fixed_dictionaries({k: values[kind] for k, kind in schema.items()}),
            ),
            min_size=1,
            max_size=30,
        )
    )
    compression = draw(st.sampled_from(["none", "lz4"]))
    shard_bytes = draw(st.sampled_from([1, 200, 1 << 20]))
    return rows, compression, shard_bytes


class Rows:
    name = "prop"

    def __init__(self, rows):
        self.rows = rows

    def __iter__(self):
        for data, metadata in self.rows:
            yield drt.CacheInput(data, metadata)


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return type(a) is type(b) and a == b


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=sources())
def test_round_trip(tmp_path_factory, runtime, io_backend, case) -> None:
    rows, algo, shard_bytes = case
    base: Path = tmp_path_factory.mktemp("rt")
    config = drt.WriterConfig(
        max_shard_bytes=shard_bytes,
        shard_compression=drt.ShardCompression(algo=algo),
        show_progress=False,
    )
    [result] = runtime.write_cache(Rows(rows), base, writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    for validate in (False, True):
        dataset = runtime.cached_dataset(
            [result.path],
            reader_config=drt.ReaderConfig(
                seed=0, shuffle=False, validate_cache=validate, io_backend=io_backend
            ),
        )
        samples = list(dataset)
        assert len(samples) == len(rows)
        for sample, (data, metadata) in zip(samples, rows):
            assert sample.data == data
            assert sample.metadata.keys() == metadata.keys()
            for key, value in metadata.items():
                assert same(sample.metadata[key], value), (key, value, sample.metadata[key])
            assert not any(isinstance(v, float) and math.isnan(v) for v in sample.metadata.values())
