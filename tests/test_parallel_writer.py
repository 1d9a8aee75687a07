"""WriterConfig(num_processes=N): sources written by spawned processes (reference 4.4)."""

from __future__ import annotations

from pathlib import Path

import pytest

import dataset_rt as drt
from tests.sources import Failing, Interrupting, Numbers, Slow


def config(**kwargs) -> drt.WriterConfig:
    return drt.WriterConfig(**{"num_processes": 2, "show_progress": False, **kwargs})


def staging(base: Path) -> list[Path]:
    return list((base / "tmp").iterdir()) if (base / "tmp").exists() else []


def test_results_in_order_and_identical_bytes(runtime, tmp_path: Path) -> None:
    sources = [Numbers("a"), Failing("b"), Numbers("c", count=0), Numbers("d", count=50)]
    results = runtime.write_cache(sources, tmp_path / "p", writer_config=config())
    assert results == [
        drt.CacheWriteSuccess("a", tmp_path / "p" / "a"),
        drt.CacheWriteError("b", "Python error: RuntimeError: boom in child"),
        drt.CacheWriteError("c", "cache source yielded no samples"),
        drt.CacheWriteSuccess("d", tmp_path / "p" / "d"),
    ]
    serial = runtime.write_cache(
        [Numbers("a"), Numbers("d", count=50)],
        tmp_path / "s",
        writer_config=drt.WriterConfig(show_progress=False),
    )
    for result in serial:
        for name in ("index.bin", "shards/000000.bin"):
            assert (result.path / name).read_bytes() == (
                tmp_path / "p" / result.source_name / name
            ).read_bytes()
    assert staging(tmp_path / "p") == []


def test_names_checked_up_front(runtime, tmp_path: Path) -> None:
    results = runtime.write_cache([Numbers("TMP"), Numbers("ok")], tmp_path, writer_config=config())
    assert results[0] == drt.CacheWriteError(
        "source[0]", "CacheSource.name must be a non-reserved plain path segment"
    )
    assert isinstance(results[1], drt.CacheWriteSuccess)
    dup = runtime.write_cache(
        [Numbers("x"), Numbers("X"), Numbers("y")], tmp_path / "d", writer_config=config()
    )
    assert dup == [drt.CacheWriteError("X", "duplicate generated cache path: X")] * 3
    assert not (tmp_path / "d").exists()


def test_unpicklable_source(runtime, tmp_path: Path) -> None:
    class Local(Numbers):
        pass

    [result] = runtime.write_cache([Local("loc")], tmp_path, writer_config=config())
    assert result.source_name == "loc"
    assert result.message.startswith("source serialization failed: ")


def test_timeout_kills_and_cleans(runtime, tmp_path: Path) -> None:
    sources = [Slow("slow", count=200), Slow("slow2", count=200), Numbers("later")]
    results = runtime.write_cache(
        sources, tmp_path, writer_config=config(process_timeout_seconds=1.0)
    )
    assert results == [
        drt.CacheWriteError(s.name, "writer process timeout exceeded") for s in sources
    ]
    assert staging(tmp_path) == []
    assert not (tmp_path / "slow").exists()


def test_interrupt_in_child_is_reraised(runtime, tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        runtime.write_cache(
            [Interrupting("i"), Numbers("n")], tmp_path, writer_config=config(num_processes=1)
        )
    assert staging(tmp_path) == []
    assert not (tmp_path / "i").exists()
