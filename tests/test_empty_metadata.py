"""Samples without metadata (issue 15 item 6).

A source whose samples all have ``metadata={}`` makes a cache whose ``metadata.arrow`` has
one row per sample and no columns. dataset-rt 0.4.8 cannot write such a cache (``Arrow
error: Invalid argument error: must either specify a row count or at least one column``)
but reads one back; dataset_rt writes and reads it (docs/compatibility.md). A source that
raises is reported with its own exception in both, whatever metadata came before. A key
that appears after samples without any is reported as any other change of keys
("metadata keys must be identical for every sample"; 0.4.8: "metadata column is out of
range").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import dataset_rt as drt

# Run unchanged by this project and by dataset-rt 0.4.8.
WRITE_SCRIPT = r"""
import json, sys
from pathlib import Path
import dataset_rt as drt


class Source:
    def __init__(self, name, rows, fail_at=None):
        self.name, self.rows, self.fail_at = name, rows, fail_at

    def __iter__(self):
        for i, row in enumerate(self.rows + [None]):
            if i == self.fail_at:
                raise KeyError("oops")
            if row is not None:
                yield drt.CacheInput(b"x" * i, row)


sources = [
    Source("nometa", [{}, {}, {}]),
    Source("raises_first", [{}], fail_at=0),
    Source("raises_after_empty", [{}, {}], fail_at=1),
    Source("raises_at_end", [{}, {}], fail_at=2),
    Source("raises_after_meta", [{"k": 1}], fail_at=1),
    Source("keys_appear", [{}, {"k": 1}]),
    Source("keys_vanish", [{"k": 1}, {}]),
]
results = drt.DatasetRuntime(num_workers=1).write_cache(
    sources, Path(sys.argv[1]), writer_config=drt.WriterConfig(show_progress=False)
)
print(json.dumps([[type(r).__name__, r.source_name, str(r[1])] for r in results]))
"""

ARROW_ERROR = (
    "Arrow error: Invalid argument error: must either specify a row count or at least one column"
)


def run_here(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
    )


def write(run, base: Path) -> list[list[str]]:
    proc = run(WRITE_SCRIPT, str(base))
    assert proc.returncode == 0, proc.stderr
    return [
        [kind, name, detail.replace(str(base), "<base>")]
        for kind, name, detail in json.loads(proc.stdout)
    ]


def expected_failures() -> list[list[str]]:
    """What both packages report for every source but "nometa"."""
    oops = "Python error: KeyError: 'oops'"
    return [
        ["CacheWriteError", "raises_first", oops],
        ["CacheWriteError", "raises_after_empty", oops],
        ["CacheWriteError", "raises_at_end", oops],
        ["CacheWriteError", "raises_after_meta", oops],
        ["CacheWriteError", "keys_appear", "metadata keys must be identical for every sample"],
        ["CacheWriteError", "keys_vanish", "metadata keys must be identical for every sample"],
    ]


def test_samples_without_metadata_make_a_cache(runtime, tmp_path: Path, io_backend: str) -> None:
    results = write(run_here, tmp_path)
    assert results[0] == ["CacheWriteSuccess", "nometa", "<base>/nometa"]
    assert results[1:] == expected_failures()
    cache = tmp_path / "nometa"
    with pa.OSFile(str(cache / "metadata.arrow"), "rb") as source:
        table = pa.ipc.open_file(source).read_all()
    assert (table.num_rows, table.num_columns) == (3, 0)
    assert json.loads((cache / "manifest.json").read_text())["metadata_schema"] == []
    for validate in (False, True):
        config = drt.ReaderConfig(
            seed=0, shuffle=False, validate_cache=validate, io_backend=io_backend
        )
        dataset = runtime.cached_dataset([cache], reader_config=config)
        assert [(s.data, s.metadata, s.sample_id) for s in dataset] == [
            (b"", {}, 0),
            (b"x", {}, 1),
            (b"xx", {}, 2),
        ]
        cache_id = next(iter(dataset)).cache_id
        assert dataset.get_item(cache_id, 2).data == b"xx"
        assert dataset.get_metadata().columns == ["cache_id", "sample_id", "weight"]
        # Batches: a metadata row per sample, no column.
        for copy in (True, False):
            [batch] = dataset.iter_batches(3, copy=copy)
            assert (len(batch), batch.metadata.shape) == (3, (3, 0))
        items = dataset.get_items([cache_id] * 2, [2, 0])
        assert (bytes(items.data), items.metadata.shape) == (b"xx", (2, 0))
        shuffled = runtime.cached_dataset(
            [cache], reader_config=drt.ReaderConfig(seed=3, io_backend=io_backend)
        )
        assert {s.sample_id for s in shuffled} <= {0, 1, 2} and len(list(shuffled)) == 3


@pytest.mark.compat
def test_same_outcomes_as_0_4_8_and_it_reads_the_cache(tmp_path: Path) -> None:
    from refenv import ReferenceUnavailable, ensure_reference, skip_or_fail

    try:
        reference = ensure_reference()
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 reference unavailable: {exc}")
    ours = write(run_here, tmp_path / "ours")
    theirs = write(reference.run, tmp_path / "ref")
    # The deliberate differences: 0.4.8 cannot write the cache, and a key appearing after
    # samples without any gets its internal "metadata column is out of range".
    assert theirs[0] == ["CacheWriteError", "nometa", ARROW_ERROR]
    assert ours[0] == ["CacheWriteSuccess", "nometa", "<base>/nometa"]
    appear = [i for i, r in enumerate(ours) if r[1] == "keys_appear"]
    assert [theirs[i] for i in appear] == [
        ["CacheWriteError", "keys_appear", "metadata column is out of range"]
    ]
    same = [i for i in range(1, len(ours)) if i not in appear]
    assert [ours[i] for i in same] == [theirs[i] for i in same]
    assert ours[1:] == expected_failures()
    # ... but reads (and validates) the cache dataset_rt wrote.
    assert reference.read_validated(tmp_path / "ours" / "nometa") == [
        [0, "", {}],
        [1, "x", {}],
        [2, "xx", {}],
    ]
