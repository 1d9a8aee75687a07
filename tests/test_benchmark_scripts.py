"""The scripts the benchmarks run in dataset-rt 0.4.8's interpreter (``portable_source``
plus a main) are self-contained: every global name their code uses is defined in the
script or is a builtin. A helper left out of a runner list fails only in the reference's
process, after minutes of our own runs (``benchmarks/write.py`` lost its reference
columns that way once), so it is checked here without running anything. Also here: the
benchmarks' reading of the kernel's proactive-reclaim settings (``common.proactive_reclaim``)
over a fake sysfs tree, and the plain cold read of a cache's files that ``read.py``'s cold
rows are judged against (``common.cold_files_bps``), and the page-cache read into
64 MiB batches that its W2 batch rows are shown against (``common.read_into_batches``)."""

from __future__ import annotations

import builtins
import importlib
import symtable
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _module(name: str) -> ModuleType:
    """The benchmark module `name` (benchmarks/ on the path, as the scripts run)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


def _scripts() -> Iterator[tuple[str, str]]:
    common = _module("common")
    write = _module("write")
    read = _module("read")
    metadata = _module("metadata")
    yield "write.py reference", common.portable_source(write.PORTABLE_RUNNER) + write.REFERENCE_MAIN
    yield (
        "read.py reference",
        common.portable_source([read.run_config, read.measure_reopen]) + read.REFERENCE_MAIN,
    )
    yield (
        "read.py rss",
        "from __future__ import annotations\n" + common.portable_source() + read.RSS_MAIN,
    )
    yield "metadata.py child", metadata.child_script()


def _free_globals(table: symtable.SymbolTable) -> Iterator[str]:
    """Names the code under ``table`` (functions, classes, nested) reads as globals."""
    for child in table.get_children():
        for symbol in child.get_symbols():
            if symbol.is_referenced() and (symbol.is_global() and not symbol.is_declared_global()):
                yield symbol.get_name()
        yield from _free_globals(child)


def _undefined(source: str) -> set[str]:
    module = symtable.symtable(source, "<benchmark script>", "exec")
    defined = {s.get_name() for s in module.get_symbols() if s.is_assigned() or s.is_imported()}
    used = set(_free_globals(module))
    used |= {s.get_name() for s in module.get_symbols() if s.is_referenced()}
    return {n for n in used - defined if not hasattr(builtins, n)}


def test_undefined_names_are_found() -> None:
    """The check itself: a function calling a helper the script does not define fails."""
    assert _undefined("def f():\n    return helper(1)\nf()\n") == {"helper"}
    assert _undefined("def helper(x):\n    return x\ndef f():\n    return helper(1)\n") == set()


@pytest.mark.parametrize(
    "label", ["write.py reference", "read.py reference", "read.py rss", "metadata.py child"]
)
def test_reference_scripts_define_every_name_they_use(label: str) -> None:
    scripts = dict(_scripts())
    assert _undefined(scripts[label]) == set(), label


def test_proactive_reclaim_names_running_pageout_schemes(tmp_path: Path) -> None:
    """``common.proactive_reclaim`` reads DAMON's sysfs tree: a running kdamond's
    ``pageout`` scheme is named with its minimum idle time (age in aggregation
    intervals); stopped kdamonds, other actions and a missing tree give None."""
    common = _module("common")

    def kdamond(name: str, state: str, action: str, age: int, aggr_us: int) -> None:
        base = tmp_path / name
        (base / "contexts/0/monitoring_attrs/intervals").mkdir(parents=True)
        (base / "state").write_text(state + "\n")
        (base / "contexts/0/monitoring_attrs/intervals/aggr_us").write_text(f"{aggr_us}\n")
        scheme = base / "contexts/0/schemes/0"
        (scheme / "access_pattern/age").mkdir(parents=True)
        (scheme / "action").write_text(action + "\n")
        (scheme / "access_pattern/age/min").write_text(f"{age}\n")
        (base / "contexts/0/schemes/nr_schemes").write_text("1\n")

    assert common.proactive_reclaim(str(tmp_path / "missing")) is None
    kdamond("0", "off", "pageout", 12, 5_000_000)
    kdamond("1", "on", "stat", 12, 5_000_000)
    assert common.proactive_reclaim(str(tmp_path)) is None
    kdamond("2", "on", "pageout", 12, 5_000_000)
    assert common.proactive_reclaim(str(tmp_path)) == (
        "DAMON pageout of memory idle for 60 s or more"
    )


def test_cold_files_bps_reads_the_files_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``common.cold_files_bps``, the plain read the cold rows of ``read.py`` are judged
    against: sequentially it reads every byte of every file under the directory;
    randomly, the asked number of 1 MiB reads at distinct 1 MiB-aligned offsets inside
    files of at least 1 MiB (smaller files are never read; no block twice, so asking for
    more reads every block once), the same offsets for the same seed."""
    import os

    common = _module("common")
    mib = 1 << 20
    (tmp_path / "a.bin").write_bytes(os.urandom(12 * mib + 5))
    (tmp_path / "b.bin").write_bytes(os.urandom(8 * mib))
    (tmp_path / "small.bin").write_bytes(b"x" * 1000)
    real = os.preadv
    reads: list[tuple[str, int, int]] = []

    def preadv(fd: int, buffers: list, offset: int) -> int:
        n = real(fd, buffers, offset)
        reads.append((Path(os.readlink(f"/proc/self/fd/{fd}")).name, offset, n))
        return n

    monkeypatch.setattr(os, "preadv", preadv)
    assert common.cold_files_bps(tmp_path) > 0
    per_file: dict[str, int] = {}
    for name, _, n in reads:
        per_file[name] = per_file.get(name, 0) + n
    assert per_file == {"a.bin": 12 * mib + 5, "b.bin": 8 * mib, "small.bin": 1000}

    reads.clear()
    assert common.cold_files_bps(tmp_path, random_blocks=15, seed=3) > 0
    assert len(reads) == 15
    first = [(name, offset) for name, offset, _ in reads]
    assert len(set(first)) == 15
    for name, offset, n in reads:
        assert name in ("a.bin", "b.bin") and offset % mib == 0 and n == mib
    assert {name for name, _ in first} == {"a.bin", "b.bin"}
    reads.clear()
    common.cold_files_bps(tmp_path, random_blocks=15, seed=3)
    assert [(name, offset) for name, offset, _ in reads] == first

    reads.clear()
    common.cold_files_bps(tmp_path, random_blocks=40, seed=3)
    assert sorted((name, offset) for name, offset, _ in reads) == [
        ("a.bin", k * mib) for k in range(12)
    ] + [("b.bin", k * mib) for k in range(8)]

    (tmp_path / "a.bin").unlink()
    (tmp_path / "b.bin").unlink()
    with pytest.raises(ValueError, match="no file of 1 MiB or more"):
        common.cold_files_bps(tmp_path, random_blocks=1)


def test_read_into_batches_reads_every_range_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``common.read_into_batches`` (the page-cache limit of W2 batches): every 1 MiB range
    of the file read exactly once, split over the threads, into destinations that stay
    inside the thread's 64 MiB buffers."""
    import os

    common = _module("common")
    mib = 1 << 20
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(5 * mib + 123))
    real = os.preadv
    reads: list[tuple[int, int]] = []

    def preadv(fd: int, buffers: list, offset: int) -> int:
        assert len(buffers) == 1 and len(buffers[0]) <= mib
        n = real(fd, buffers, offset)
        reads.append((offset, n))
        return n

    monkeypatch.setattr(os, "preadv", preadv)
    assert common.read_into_batches(path, threads=2, batch_bytes=2 * mib) == 5 * mib + 123
    assert sorted(reads) == [(k * mib, mib) for k in range(5)] + [(5 * mib, 123)]
