"""The seed program (examples/cache_text.py): its output, and reuse without iterating."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import dataset_rt as drt

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cache_text.py"
EXPECTED = (
    "[CacheWriteSuccess(source_name='text_records_v1', "
    "path=PosixPath('cache_text/text_records_v1'))]\n"
    "hello world [104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100] 0\n"
    "dataset caching [100, 97, 116, 97, 115, 101, 116, 32, 99, 97, 99, 104, 105, 110, 103] 1\n"
)


def test_seed_example_twice(tmp_path: Path) -> None:
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, str(EXAMPLE)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout == EXPECTED
    cache = tmp_path / "cache_text" / "text_records_v1"
    reference = ROOT / "tests" / "fixtures" / "dataset-rt-0.4.8" / "text_records_v1"
    assert (cache / "index.bin").read_bytes() == (reference / "index.bin").read_bytes()
    assert (cache / "shards" / "000000.bin").read_bytes() == (
        reference / "shards" / "000000.bin"
    ).read_bytes()
    ours = (cache / "manifest.json").read_text().splitlines()
    theirs = (reference / "manifest.json").read_text().splitlines()
    assert [a for a in ours if "metadata_sha256" not in a] == [
        b for b in theirs if "metadata_sha256" not in b
    ]
    assert list((tmp_path / "cache_text" / "tmp").iterdir()) == []


def test_second_run_does_not_iterate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    spec = importlib.util.spec_from_file_location("cache_text_example", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.chdir(tmp_path)
    module.main()
    assert capsys.readouterr().out == EXPECTED

    def refuse(self: object) -> None:
        raise AssertionError("the source must not be iterated when its cache exists")

    monkeypatch.setattr(module.TextSamples, "__iter__", refuse)
    module.main()
    assert capsys.readouterr().out == EXPECTED


def test_reuse_reports_broken_existing_path(tmp_path: Path, runtime) -> None:
    """Compatibility policy 5: an existing path that is not a cache is a CacheWriteError."""
    (tmp_path / "text_records_v1").mkdir()

    class Source:
        name = "text_records_v1"

        def __iter__(self):
            raise AssertionError("not iterated")

    result = runtime.from_cache_sources(Source(), tmp_path, reader_config=drt.ReaderConfig(seed=0))
    assert result == drt.CacheSourcesDatasetError(
        [
            drt.CacheWriteError(
                "text_records_v1", f"missing manifest: {tmp_path}/text_records_v1/manifest.json"
            )
        ],
        "no caches were written: text_records_v1: "
        f"missing manifest: {tmp_path}/text_records_v1/manifest.json",
    )
