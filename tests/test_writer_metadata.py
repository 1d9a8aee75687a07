"""metadata.arrow as the library writes it (``DRT_WRITER_METADATA``) and as it checks a
caller's file at ``drt_writer_finish`` (without the flag)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from refenv import ensure_reference

import dataset_rt as drt
from dataset_rt import _native

KIND = _native.Kind


def _ipc(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


ROWS = [
    {"flag": True, "n": -(2**63), "score": -0.0, "text": ""},
    {"flag": False, "n": 2**63 - 1, "score": 5e-324, "text": "é\u00a0漢字 🙂"},
    {"flag": True, "n": 0, "score": 1.7976931348623157e308, "text": "a" * 1000},
    *(
        {"flag": i % 3 == 0, "n": i * 7919, "score": i / 7, "text": f"row {i}"}
        for i in range(3, 45)
    ),
]


class _Source:
    """Yields ROWS; memoryview payloads make the writer append one sample per call, so
    the bool bitmap grows across calls at every bit position."""

    def __init__(self, name: str, *, views: bool) -> None:
        self.name = name
        self.views = views

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i, row in enumerate(ROWS):
            data = bytes([i]) * i
            yield drt.CacheInput(data=memoryview(data) if self.views else data, metadata=row)


@pytest.mark.parametrize("views", [False, True], ids=["batched", "one-per-append"])
def test_written_metadata_is_the_rows_as_pyarrow_and_polars_read_them(
    tmp_path: Path, views: bool
) -> None:
    runtime = drt.DatasetRuntime(num_workers=2)
    [result] = runtime.write_cache([_Source("c", views=views)], tmp_path)
    assert isinstance(result, drt.CacheWriteSuccess), result
    path = tmp_path / "c" / "metadata.arrow"
    table = _ipc(path)
    assert table.schema == pa.schema(
        [
            pa.field("flag", pa.bool_(), nullable=False),
            pa.field("n", pa.int64(), nullable=False),
            pa.field("score", pa.float64(), nullable=False),
            pa.field("text", pa.utf8(), nullable=False),
        ]
    )
    assert table.to_pylist() == ROWS
    # -0.0 and the smallest subnormal survive bit for bit.
    assert math.copysign(1.0, table["score"][0].as_py()) == -1.0
    assert pl.read_ipc(path).to_dicts() == ROWS
    dataset = runtime.cached_dataset(
        [tmp_path / "c"], reader_config=drt.ReaderConfig(seed=0, validate_cache=True)
    )
    assert dataset.get_metadata().drop(["cache_id", "sample_id", "weight"]).to_dicts() == ROWS


def test_a_cache_without_metadata_keys_has_one_row_per_sample(tmp_path: Path) -> None:
    class NoKeys:
        name = "k"

        def __iter__(self):  # type: ignore[no-untyped-def]
            for i in range(11):
                yield drt.CacheInput(data=b"x" * i, metadata={})

    [result] = drt.DatasetRuntime(num_workers=1).write_cache([NoKeys()], tmp_path)
    assert isinstance(result, drt.CacheWriteSuccess), result
    table = _ipc(tmp_path / "k" / "metadata.arrow")
    assert (table.num_rows, table.num_columns) == (11, 0)


def test_dataset_rt_048_reads_the_written_metadata(tmp_path: Path) -> None:
    runtime = drt.DatasetRuntime(num_workers=2)
    [result] = runtime.write_cache([_Source("c", views=True)], tmp_path)
    assert isinstance(result, drt.CacheWriteSuccess), result
    rows = ensure_reference().read_validated(tmp_path / "c")
    assert [metadata for _, _, metadata in rows] == ROWS


# ------------------------------------------------- the caller's metadata.arrow, checked


NO_FLAGS = _native.WriterFlag(0)


def _caller_writer(
    runtime: _native.Runtime, base: Path, flags: _native.WriterFlag = NO_FLAGS
) -> _native.Writer:
    """A writer (without DRT_WRITER_METADATA unless ``flags`` say so) holding three
    samples of schema (label: int, name: string)."""
    writer = _native.Writer.open(
        runtime,
        base,
        "c",
        _native.WriterOptions(
            max_shard_bytes=1 << 20,
            prefetch_size=4,
            compression=_native.Compression.NONE,
            compression_ratio=1.0,
            flags=flags,
        ),
    )
    writer.set_schema(["label", "name"], [KIND.INT, KIND.STRING])
    offsets = np.array([0, 1, 2, 3], dtype=np.uint64)
    writer.append(
        3,
        b"abc",
        offsets,
        [
            (KIND.INT, np.array([1, 2, 3], dtype=np.int64), None),
            (KIND.STRING, b"xyz", offsets),
        ],
    )
    return writer


def _write_ipc(path: Path, table: pa.Table) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as ipc:
        ipc.write_table(table)


GOOD = pa.table(
    {"label": pa.array([1, 2, 3], pa.int64()), "name": pa.array(["x", "y", "z"], pa.utf8())}
)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (GOOD.slice(0, 2), "metadata.arrow has 2 rows, the cache 3 samples: "),
        (GOOD.select(["label"]), "metadata.arrow has 1 columns, the schema 2: "),
        (GOOD.select(["name", "label"]), "metadata.arrow column 0 is not 'label' (int): "),
        (
            GOOD.set_column(0, "label", pa.array([1, 2, 3], pa.int32())),
            "metadata.arrow column 0 is not 'label' (int): ",
        ),
        (
            GOOD.set_column(1, "name", pa.array(["x", None, "z"], pa.utf8())),
            "metadata.arrow column 'name' has nulls: ",
        ),
        (None, "Arrow error: Parser error: Arrow file does not contain correct footer: "),
    ],
    ids=["rows", "columns", "order", "type", "nulls", "not-arrow"],
)
def test_finish_refuses_a_callers_metadata_that_does_not_fit(
    tmp_path: Path, table: pa.Table | None, message: str
) -> None:
    runtime = _native.Runtime.open(1)
    with _caller_writer(runtime, tmp_path) as writer:
        target = Path(writer.staging_path()) / "metadata.arrow"
        if table is None:
            target.write_bytes(b"ARROW1\0\0 not an Arrow file")
        else:
            _write_ipc(target, table)
        with pytest.raises((ValueError, RuntimeError)) as info:
            writer.finish()
        assert str(info.value) == message + str(target)
    # Nothing was published, and the staging directory went with the writer.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]
    assert list((tmp_path / "tmp").iterdir()) == []


def test_finish_publishes_a_callers_metadata_that_fits(tmp_path: Path) -> None:
    runtime = _native.Runtime.open(1)
    with _caller_writer(runtime, tmp_path) as writer:
        _write_ipc(Path(writer.staging_path()) / "metadata.arrow", GOOD)
        writer.finish()
    assert _ipc(tmp_path / "c" / "metadata.arrow").equals(GOOD)


# Run in a child with a deadline: a FIFO used to block finish for good (even SIGINT).
_SPECIAL_FILE_SCRIPT = """
import os, sys
from pathlib import Path
sys.path[:0] = [sys.argv[3], sys.argv[3] + "/tests"]
import tests.test_writer_metadata as t
from dataset_rt import _native
base, kind = Path(sys.argv[1]), sys.argv[2]
flags = _native.WriterFlag.METADATA if kind.startswith("flag-") else _native.WriterFlag(0)
with t._caller_writer(_native.Runtime.open(1), base, flags) as writer:
    target = Path(writer.staging_path()) / "metadata.arrow"
    what = kind.removeprefix("flag-")
    if what == "fifo":
        os.mkfifo(target)
    elif what == "directory":
        target.mkdir()
    else:
        (base / "outside").write_bytes(b"keep me")
        target.symlink_to(base / "outside")
    try:
        writer.finish()
        print("published")
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}")
"""


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("fifo", "ValueError: not a regular file: {target}"),
        ("directory", "ValueError: not a regular file: {target}"),
        ("flag-fifo", "published"),
        ("flag-symlink", "published"),
        ("flag-directory", "RuntimeError: I/O error: Is a directory (os error 21): {target}"),
    ],
)
def test_finish_never_blocks_on_or_writes_through_what_is_at_metadata_arrow(
    tmp_path: Path, kind: str, expected: str
) -> None:
    """Without the flag a FIFO or a directory at metadata.arrow is refused as not a
    regular file (a FIFO's open used to block finish); with it whatever is there is
    replaced, never written through (a symbolic link's target is left alone)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-c", _SPECIAL_FILE_SCRIPT, str(tmp_path), kind, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    staging = [p for p in (tmp_path / "tmp").iterdir()] if (tmp_path / "tmp").exists() else []
    assert staging == []  # removed on close, published or not
    if expected == "published":
        assert line == expected
        published = tmp_path / "c" / "metadata.arrow"
        assert published.is_file() and not published.is_symlink()
        assert _ipc(published).column("label").to_pylist() == [1, 2, 3]
        if kind == "flag-symlink":
            assert (tmp_path / "outside").read_bytes() == b"keep me"
    else:
        assert re.fullmatch(
            re.escape(expected).replace(
                re.escape("{target}"), r"\S+/tmp/c\.[0-9a-f]+\.drt/metadata\.arrow"
            ),
            line,
        ), line
        assert not (tmp_path / "c").exists()
