"""Source fingerprints: stale caches are reported, or rebuilt and swapped in atomically."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import dataset_rt as drt


class Versioned:
    def __init__(self, version: str, fingerprint: str | None, count: int = 40) -> None:
        self.name = "feat"
        self.version = version
        self.count = count
        if fingerprint is not None:
            self.fingerprint = fingerprint
        self.iterated = False

    def __iter__(self):
        self.iterated = True
        for i in range(self.count):
            yield drt.CacheInput(f"{self.version}:{i}".encode() * 50, {"i": i})


def tree(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


CONFIG = drt.ReaderConfig(seed=0, shuffle=False)
SMALL_SHARDS = drt.WriterConfig(show_progress=False, max_shard_bytes=2000)


def test_fingerprint_stored_and_reused(runtime, tmp_path: Path) -> None:
    first = Versioned("a", "fp-1")
    result = runtime.from_cache_sources(
        first, tmp_path, reader_config=CONFIG, writer_config=SMALL_SHARDS
    )
    assert isinstance(result, drt.CacheSourcesDatasetSuccess)
    manifest = json.loads((tmp_path / "feat" / "manifest.json").read_text())
    assert list(manifest)[-1] == "fingerprint" and manifest["fingerprint"] == "fp-1"
    again = Versioned("a", "fp-1")
    result = runtime.from_cache_sources(
        again, tmp_path, reader_config=CONFIG, writer_config=SMALL_SHARDS
    )
    assert isinstance(result, drt.CacheSourcesDatasetSuccess) and not again.iterated


def test_stale_fingerprint_is_reported_and_cache_untouched(runtime, tmp_path: Path) -> None:
    runtime.from_cache_sources(
        Versioned("a", "fp-1"), tmp_path, reader_config=CONFIG, writer_config=SMALL_SHARDS
    )
    before = tree(tmp_path / "feat")
    stale = Versioned("b", "fp-2")
    result = runtime.from_cache_sources(
        stale, tmp_path, reader_config=CONFIG, writer_config=SMALL_SHARDS
    )
    message = (
        f"stale cache {tmp_path / 'feat'}: its fingerprint 'fp-1' differs from the "
        "source's 'fp-2'; nothing was rebuilt or deleted "
        "(WriterConfig(on_stale='rebuild') rebuilds it)"
    )
    assert result == drt.CacheSourcesDatasetError(
        [drt.CacheWriteError("feat", message)], f"no caches were written: feat: {message}"
    )
    assert not stale.iterated
    assert tree(tmp_path / "feat") == before
    # A source without a fingerprint behaves like the reference: the cache is reused.
    plain = Versioned("c", None)
    result = runtime.from_cache_sources(
        plain, tmp_path, reader_config=CONFIG, writer_config=SMALL_SHARDS
    )
    assert isinstance(result, drt.CacheSourcesDatasetSuccess) and not plain.iterated


def test_rebuild_swaps_atomically_and_old_readers_never_mix(runtime, tmp_path: Path) -> None:
    runtime.from_cache_sources(
        Versioned("a", "fp-1"), tmp_path, reader_config=CONFIG, writer_config=SMALL_SHARDS
    )
    old = runtime.cached_dataset(
        [tmp_path / "feat"], reader_config=drt.ReaderConfig(seed=0, shuffle=False, prefetch_size=1)
    )
    old.set_epoch_len(1)
    assert next(iter(old)).data.startswith(b"a:0")
    rebuild = SMALL_SHARDS.model_copy(update={"on_stale": "rebuild"})
    result = runtime.from_cache_sources(
        Versioned("b", "fp-2"), tmp_path, reader_config=CONFIG, writer_config=rebuild
    )
    assert isinstance(result, drt.CacheSourcesDatasetSuccess)
    assert [s.data[:3] for s in result.dataset][:2] == [b"b:0", b"b:1"]
    assert json.loads((tmp_path / "feat" / "manifest.json").read_text())["fingerprint"] == "fp-2"
    assert list((tmp_path / "tmp").iterdir()) == []
    # The dataset opened before the swap reads old bytes or fails clearly; never new bytes.
    old.set_epoch_len(40)
    with pytest.raises(
        ValueError, match="was replaced \\(rebuilt\\) or removed while this dataset was open"
    ):
        for sample in old:
            assert sample.data.startswith(f"a:{sample.sample_id}".encode())
    with pytest.raises(ValueError, match="was replaced"):
        old.get_item(next(iter(result.dataset)).cache_id, 39)
    # Its metadata table, first built now, is not the rebuilt cache's either.
    with pytest.raises(ValueError, match="was replaced"):
        old.get_metadata()


def test_inspect_shows_fingerprint(runtime, tmp_path: Path) -> None:
    import subprocess
    import sys

    runtime.write_cache(Versioned("a", "fp-9"), tmp_path, writer_config=SMALL_SHARDS)
    out = subprocess.run(
        [sys.executable, "-m", "dataset_rt", "inspect", "--json", str(tmp_path / "feat")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out)[0]["fingerprint"] == "fp-9"


def test_bad_fingerprint_type(runtime, tmp_path: Path) -> None:
    source = Versioned("a", None)
    source.fingerprint = 5  # type: ignore[attr-defined]
    assert runtime.write_cache(source, tmp_path, writer_config=SMALL_SHARDS) == [
        drt.CacheWriteError("source[0]", "CacheSource.fingerprint must be a string")
    ]
    # One that cannot be stored (a lone surrogate) fails its source alone, before any write.
    good, bad = Versioned("c", "ok"), Versioned("b", "v1-\ud800")
    bad.name = "other"
    results = runtime.write_cache([good, bad], tmp_path / "two", writer_config=SMALL_SHARDS)
    assert isinstance(results[0], drt.CacheWriteSuccess), results
    assert results[1] == drt.CacheWriteError(
        "source[1]",
        "CacheSource.fingerprint must be encodable as UTF-8: 'utf-8' codec can't encode "
        "character '\\ud800' in position 3: surrogates not allowed",
    )


@pytest.mark.compat
def test_reference_reads_fingerprinted_caches(runtime, tmp_path: Path) -> None:
    from tests.refenv import (
        ReferenceSetupError,
        ReferenceUnavailable,
        ensure_reference,
        skip_or_fail,
    )

    try:
        reference = ensure_reference()
    except ReferenceUnavailable as exc:
        print(f"dataset-rt 0.4.8 reference unavailable: {exc}")
        skip_or_fail(f"dataset-rt 0.4.8 reference unavailable: {exc}")
    except ReferenceSetupError as exc:
        pytest.fail(f"could not set up the dataset-rt 0.4.8 reference: {exc}", pytrace=False)
    runtime.write_cache(Versioned("a", "fp-ref"), tmp_path, writer_config=SMALL_SHARDS)
    script = (
        "import sys, dataset_rt as drt\n"
        "ds = drt.DatasetRuntime(num_workers=1).cached_dataset([sys.argv[1]], "
        "reader_config=drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True))\n"
        "print(len([s for s in ds if s.data.startswith(f'a:{s.sample_id}'.encode())]))\n"
    )
    result = reference.run(script, str(tmp_path / "feat"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "40"
