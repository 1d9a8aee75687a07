"""Small records read from shard mappings within a byte budget (``io/files.zig`` ``Maps``:
at most 48 MiB of 2 MiB shard windows per ordered iterator, 132 MiB per shuffled iterator
and per lookup).

A cache of small records larger than either budget, in the page cache: per-sample reads
(ordered and shuffled) and lookups return every payload intact, the same stream on every
backend and prefetch size, and reading an epoch adds at most about the budget to the
peak resident set (the mapped pages count in it once touched).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dataset_rt as drt

ROOT = Path(__file__).resolve().parents[1]

COUNT = 360_000  # x 512 B: about 190 MB of shards, more than either budget
RECORD = 512
BUDGET_MIB = {False: 48, True: 132}  # by shuffle


def _payload(i: int) -> bytes:
    return i.to_bytes(4, "little") * (RECORD // 4)


class _Small:
    name = "small"

    def __iter__(self) -> Any:
        for i in range(COUNT):
            yield drt.CacheInput(_payload(i), {"i": i})


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("mapped-budget")
    rt = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(
        show_progress=False,
        max_shard_bytes=24 << 20,  # a few shards, each larger than several windows
        shard_compression=drt.ShardCompression(algo="none"),
    )
    [result] = rt.write_cache(_Small(), base, writer_config=config)
    assert type(result).__name__ == "CacheWriteSuccess", result
    return Path(result.path)


def _warm(path: Path) -> None:
    """Bring the shards into the page cache (mapped reads serve only resident pages)."""
    for shard in sorted((path / "shards").iterdir()):
        with open(shard, "rb") as handle:
            while handle.read(8 << 20):
                pass


def _check(samples: list[tuple[int, bytes, dict[str, Any]]]) -> None:
    for sid, data, meta in samples:
        assert data == _payload(sid) and meta == {"i": sid}, sid


@pytest.mark.parametrize("shuffle", [False, True])
def test_stream_is_intact_and_the_same_everywhere(
    runtime, io_backend: str, small_cache: Path, shuffle: bool
) -> None:
    _warm(small_cache)

    def stream(**options: Any) -> list[tuple[int, bytes, dict[str, Any]]]:
        config = drt.ReaderConfig(seed=3, shuffle=shuffle, io_backend=io_backend, **options)
        ds = runtime.cached_dataset([small_cache], reader_config=config)
        return [(s.sample_id, s.data, s.metadata) for s in ds]

    expected = stream()
    assert len(expected) == COUNT
    _check(expected)
    if not shuffle:
        assert [sid for sid, _, _ in expected] == list(range(COUNT))
    for prefetch_size in (1, 256):
        assert stream(prefetch_size=prefetch_size) == expected, prefetch_size


def test_lookups_over_many_windows(runtime, small_cache: Path) -> None:
    _warm(small_cache)
    ds = runtime.cached_dataset([small_cache], reader_config=drt.ReaderConfig(seed=0))
    cache_id = next(iter(ds)).cache_id
    order = np.random.default_rng(11).permutation(COUNT).astype(np.uint64)
    cids = np.full(4096, cache_id, dtype=np.uint64)
    for start in range(0, COUNT, 4096):
        sids = order[start : start + 4096]
        batch = ds.get_items(cids[: len(sids)], sids)
        offsets = batch.offsets
        for i, sid in enumerate(sids.tolist()):
            assert batch.data[offsets[i] : offsets[i + 1]].tobytes() == _payload(sid), sid
        assert batch.metadata["i"].to_list() == sids.tolist()
    for sid in order[:20_000].tolist():
        sample = ds.get_item(cache_id, sid)
        assert sample.data == _payload(sid) and sample.metadata == {"i": sid}


GROWTH = textwrap.dedent("""
    import sys
    import dataset_rt as drt

    def hwm_mib():
        with open("/proc/self/status") as status:
            line = [x for x in status if x.startswith("VmHWM:")][0]
        return int(line.split()[1]) / 1024

    path, backend, shuffle = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    rt = drt.DatasetRuntime(num_workers=2)
    ds = rt.cached_dataset([path], reader_config=drt.ReaderConfig(
        seed=0, shuffle=shuffle, io_backend=backend))
    first = next(iter(ds))  # the library's own start-up memory is not the reader's
    before = hwm_mib()
    n = 0
    for sample in ds:
        n += len(sample.data)
    assert n == int(sys.argv[4]) * 512, n
    print(hwm_mib() - before)
""")


@pytest.mark.parametrize("shuffle", [False, True])
def test_mapped_reads_add_at_most_the_budget_to_peak_rss(
    io_backend: str, small_cache: Path, shuffle: bool
) -> None:
    """One epoch over about 190 MB of warm shards: before the budget every touched page of
    every shard stayed mapped (the growth was the shards' size); now at most the budget's
    windows are mapped (48 MiB ordered, 132 MiB shuffled), plus the iterator's and
    Python's own few MiB."""
    _warm(small_cache)
    result = subprocess.run(
        [sys.executable, "-c", GROWTH, str(small_cache), io_backend, str(int(shuffle)), str(COUNT)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    growth = float(result.stdout.strip())
    assert growth < BUDGET_MIB[shuffle] + 10, f"peak RSS grew by {growth:.0f} MiB"
