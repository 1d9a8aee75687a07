"""Caches on object storage, against a real S3-compatible server on 127.0.0.1 (moto's
standalone server, tests/remote_server.py) through the same client (obstore) a user's
AWS or MinIO endpoint sees: round trips, every read mode compared with the local copy,
budgets smaller than the dataset, several processes sharing a shard cache, uploads, and
the faults (404, 403, connection refused, objects changed or truncated behind the
reader, a full disk in the shard cache)."""

from __future__ import annotations

import gc
import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, expected
from remote_server import S3Server, client_env, free_port, require_remote_packages
from sources import Numbers

import dataset_rt as drt

WRITER = drt.WriterConfig(max_shard_bytes=2000)


@pytest.fixture
def shard_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh local cache directory (DATASET_RT_CACHE_DIR) for the test."""
    root = tmp_path / "local-cache"
    monkeypatch.setenv("DATASET_RT_CACHE_DIR", str(root))
    monkeypatch.delenv("DATASET_RT_SHARD_CACHE_BYTES", raising=False)
    return root


# Remotes made by the tests that patch the transport: kept for the life of the process,
# as dataset_rt.remote keeps its own (a fetch-ahead thread may still call back after the
# last dataset using one closes).
_TEST_REMOTES: list[dict[Any, Any]] = []


def fresh_remotes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the next dataset build its own Remote (and so use a patched transport)."""
    from dataset_rt import remote as remote_mod

    _TEST_REMOTES.append({})
    monkeypatch.setattr(remote_mod, "_REMOTES", _TEST_REMOTES[-1])


def rows(dataset: Any) -> list[tuple[bytes, dict[str, Any], int, int]]:
    return [(s.data, s.metadata, s.cache_id, s.sample_id) for s in dataset]


def obstore_store(url: str) -> tuple[Any, str]:
    from dataset_rt.remote import ObstoreTransport

    return ObstoreTransport().locate(url)


def put(url: str, data: bytes) -> None:
    import obstore

    store, key = obstore_store(url)
    obstore.put(store, key, data)


def get(url: str) -> bytes:
    import obstore

    store, key = obstore_store(url)
    return bytes(obstore.get(store, key).bytes())


def listing(url: str) -> list[str]:
    import obstore

    store, key = obstore_store(url)
    return sorted(m["path"] for batch in obstore.list(store, key) for m in batch)


def write_both(runtime: Any, tmp_path: Path, bucket: str, count: int = 300) -> tuple[str, Path]:
    """The same sources written locally and to the bucket; (url, local path) of "a"."""
    sources = [Numbers("a", count, 97), Numbers("b", count // 3, 13)]
    local = runtime.write_cache(sources, tmp_path / "local", writer_config=WRITER)
    remote = runtime.write_cache(sources, f"{bucket}/prefix", writer_config=WRITER)
    assert all(isinstance(r, drt.CacheWriteSuccess) for r in local + remote), local + remote
    assert [r.path for r in remote] == [f"{bucket}/prefix/a", f"{bucket}/prefix/b"]
    return f"{bucket}/prefix", tmp_path / "local"


def shard_files(root: Path) -> list[Path]:
    return sorted((root / "shards").glob("*.bin"))


READ_MODES = {
    "ordered": drt.ReaderConfig(seed=1, prefetch_size=16, shuffle=False),
    "shuffled": drt.ReaderConfig(seed=7, prefetch_size=16, shuffle=True),
    "permutation": drt.ReaderConfig(seed=9, prefetch_size=16, shuffle=True, sampling="permutation"),
}


@pytest.mark.parametrize("mode", sorted(READ_MODES))
@pytest.mark.parametrize("budget", [None, 5000])
def test_remote_reads_equal_local(
    runtime, s3_bucket, shard_cache, tmp_path, io_backend, mode, budget, monkeypatch
) -> None:
    if budget is not None:  # smaller than the dataset (about 40 KB of shards)
        monkeypatch.setenv("DATASET_RT_SHARD_CACHE_BYTES", str(budget))
    base, local = write_both(runtime, tmp_path, s3_bucket)
    config = READ_MODES[mode].model_copy(update={"io_backend": io_backend})
    remote_ds = runtime.cached_dataset([f"{base}/a", f"{base}/b"], reader_config=config)
    local_ds = runtime.cached_dataset([local / "a", local / "b"], reader_config=config)
    assert remote_ds.cache_paths == [f"{base}/a", f"{base}/b"]
    assert len(remote_ds) == len(local_ds)
    for _ in range(2):  # two epochs: the second reads the shard cache (or refetches)
        want_rows = rows(local_ds)
        assert rows(remote_ds) == want_rows
    assert remote_ds.get_metadata().equals(local_ds.get_metadata())
    # get_item, in reverse order.
    first = want_rows[0]
    for sample_id in reversed(range(0, 300, 37)):
        r = remote_ds.get_item(first[2], sample_id)
        l_ = local_ds.get_item(first[2], sample_id)
        assert (r.data, r.metadata) == (l_.data, l_.metadata)
    # Batches.
    got = [b.metadata.to_dicts() for b in remote_ds.iter_batches(50)]
    want = [b.metadata.to_dicts() for b in local_ds.iter_batches(50)]
    assert got == want
    # Closing stops background fetches (look-ahead) still under way: their temporary
    # files go.
    del remote_ds
    gc.collect()
    deadline = time.monotonic() + 30
    while list((shard_cache / "shards").glob("*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.05)
    files = shard_files(shard_cache)
    if budget is None or mode == "ordered":
        assert files, "shards come through the shard cache"
    else:
        # Shuffled over a budget smaller than the cache: a's records are read by byte
        # ranges, get_item too; nothing of a is fetched whole (b fits the budget).
        a_shards = json.loads(get(f"{base}/a/manifest.json"))["shards"]
        assert not {s["sha256"] for s in a_shards} & {f.stem for f in files}
    if budget is not None:
        assert sum(f.stat().st_size for f in files) <= budget
    assert not list((shard_cache / "shards").glob("*.tmp"))


def test_weighted_reads_equal_local(runtime, s3_bucket, shard_cache, tmp_path) -> None:
    import polars as pl

    base, local = write_both(runtime, tmp_path, s3_bucket, count=120)
    config = drt.ReaderConfig(seed=5, prefetch_size=8, shuffle=True)
    datasets = [
        runtime.cached_dataset([f"{base}/a"], reader_config=config),
        runtime.cached_dataset([local / "a"], reader_config=config),
    ]
    for ds in datasets:
        table = ds.get_metadata()
        ds.update_metadata(
            table.filter(pl.col("i") % 3 != 0).with_columns(
                weight=(pl.col("i") % 5 + 1).cast(pl.Float64)
            )
        )
    assert rows(datasets[0]) == rows(datasets[1])


def test_cache_uploaded_with_the_client_reads_as_the_fixture(
    runtime, s3_bucket, shard_cache
) -> None:
    """A cache uploaded with any tool (here obstore, file by file) is readable."""
    name = "lz4_many_shards"
    for path in sorted((FIXTURES / name).rglob("*")):
        if path.is_file():
            put(
                f"{s3_bucket}/up/{name}/{path.relative_to(FIXTURES / name).as_posix()}",
                path.read_bytes(),
            )
    config = drt.ReaderConfig(seed=0, prefetch_size=4, validate_cache=True, shuffle=False)
    ds = runtime.cached_dataset([f"{s3_bucket}/up/{name}"], reader_config=config)
    samples = rows(ds)
    assert samples == rows(runtime.cached_dataset([FIXTURES / name], reader_config=config))
    want = expected(name)
    assert len(samples) == len(want["samples"])


def test_uploaded_cache_downloads_as_a_valid_local_cache(
    runtime, s3_bucket, shard_cache, tmp_path
) -> None:
    """What write_cache uploads, downloaded with any tool, is a valid local cache: the same
    files, manifest last."""
    base, local = write_both(runtime, tmp_path, s3_bucket, count=60)
    keys = listing(f"{base}/a")
    down = tmp_path / "down"
    prefix = base.split("://")[1].split("/", 1)[1] + "/a/"
    for key in keys:
        target = down / key.split(prefix, 1)[1]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(get(f"{s3_bucket}/{key}"))
    assert sorted(p.relative_to(down).as_posix() for p in down.rglob("*") if p.is_file()) == sorted(
        p.relative_to(local / "a").as_posix() for p in (local / "a").rglob("*") if p.is_file()
    )
    config = drt.ReaderConfig(seed=0, prefetch_size=4, validate_cache=True)
    assert rows(runtime.cached_dataset([down], reader_config=config)) == rows(
        runtime.cached_dataset([local / "a"], reader_config=config)
    )


def test_mixed_local_and_remote_paths(runtime, s3_bucket, shard_cache, tmp_path) -> None:
    base, local = write_both(runtime, tmp_path, s3_bucket, count=90)
    config = drt.ReaderConfig(seed=2, prefetch_size=8, shuffle=True)
    mixed = runtime.cached_dataset([local / "a", f"{base}/b"], reader_config=config)
    plain = runtime.cached_dataset([local / "a", local / "b"], reader_config=config)
    assert rows(mixed) == rows(plain)
    assert mixed.get_metadata().equals(plain.get_metadata())


def test_dump_config_keeps_urls_and_from_config_reads_the_same(
    runtime, s3_bucket, shard_cache, tmp_path
) -> None:
    """`dataset.json` names a remote cache by its URL (a local one by its resolved
    directory), and the dataset it rebuilds reads the same stream; the PyTorch loader's
    workers open their readers from the same file."""
    base, local = write_both(runtime, tmp_path, s3_bucket, count=90)
    config = drt.ReaderConfig(seed=4, prefetch_size=8, shuffle=True)
    mixed = runtime.cached_dataset([local / "a", f"{base}/b"], reader_config=config)
    plain = runtime.cached_dataset([local / "a", local / "b"], reader_config=config)
    saved = []
    for name, dataset in (("mixed", mixed), ("plain", plain)):
        (tmp_path / name).mkdir()
        saved.append(dataset.dump_config(tmp_path / name))
    assert json.loads(saved[0].read_text())["cache_paths"] == [
        str((local / "a").resolve()),
        f"{base}/b",
    ]
    # from_config installs the active table (weighted draws, as in 0.4.8): compare the
    # rebuilt remote dataset with the rebuilt local one.
    again = [drt.CachedDataset.from_config(path) for path in saved]
    assert rows(again[0]) == rows(again[1])


def test_write_never_replaces_and_from_cache_sources_reuses(
    runtime, s3_bucket, shard_cache
) -> None:
    base = f"{s3_bucket}/reuse"
    config = drt.ReaderConfig(seed=0, prefetch_size=4)
    first = runtime.from_cache_sources(
        [Numbers("n", 40)], base, reader_config=config, writer_config=WRITER
    )
    assert isinstance(first, drt.CacheSourcesDatasetSuccess), first
    before = get(f"{base}/n/manifest.json")
    again = runtime.write_cache([Numbers("n", 41)], base, writer_config=WRITER)
    assert again == [drt.CacheWriteError("n", f"cache path already exists: {base}/n")]

    class Exploding(Numbers):
        def __iter__(self):
            raise AssertionError("a reused cache's source is not iterated")

    second = runtime.from_cache_sources(
        [Exploding("n", 40)], base, reader_config=config, writer_config=WRITER
    )
    assert isinstance(second, drt.CacheSourcesDatasetSuccess), second
    assert second.results == [drt.CacheWriteSuccess("n", f"{base}/n")]
    assert rows(second.dataset) == rows(first.dataset)
    assert get(f"{base}/n/manifest.json") == before


def test_objects_without_a_manifest_are_never_written_over(
    runtime, s3_bucket, shard_cache, tmp_path
) -> None:
    """A prefix holding objects but no manifest.json (an interrupted upload, a copy by
    another tool cut short) is not a complete cache: writes and reuse refuse it before the
    source is iterated, as they refuse a local path that exists, and an upload checks again
    under its lock; nothing there is touched."""
    from dataset_rt import remote

    base = f"{s3_bucket}/partial"
    put(f"{base}/n/index.bin", b"another tool's index")
    put(f"{base}/n/shards/000007.bin", b"another tool's shard")
    before = listing(f"{base}/n")

    class Exploding(Numbers):
        def __iter__(self):
            raise AssertionError("the source of a refused write is not iterated")

    expected = (
        f"cache path already exists: {base}/n (it holds objects but no manifest.json, so it "
        "is not a complete cache: partial/n/index.bin, partial/n/shards/000007.bin); delete "
        f"them (for example: aws s3 rm --recursive {base}/n/) before writing this cache"
    )
    written = runtime.write_cache([Exploding("n")], base, writer_config=WRITER)
    assert written == [drt.CacheWriteError("n", expected)]
    reused = runtime.from_cache_sources(
        [Exploding("n")], base, reader_config=drt.ReaderConfig(seed=0), writer_config=WRITER
    )
    assert isinstance(reused, drt.CacheSourcesDatasetError)
    assert reused.results == [drt.CacheWriteError("n", expected)]
    # The upload itself (Ray's datasink uploads a cache built elsewhere).
    local = tmp_path / "local"
    assert runtime.write_cache([Numbers("n", 5)], local, writer_config=WRITER)[0].path
    with pytest.raises(FileExistsError, match=r"holds objects but no manifest\.json"):
        remote.upload_cache(local / "n", f"{base}/n")
    assert listing(f"{base}/n") == before
    assert get(f"{base}/n/index.bin") == b"another tool's index"


def test_stale_fingerprint_on_a_url_is_reported(runtime, s3_bucket, shard_cache) -> None:
    base = f"{s3_bucket}/fp"

    class Printed(Numbers):
        def __init__(self, name: str, fingerprint: str) -> None:
            super().__init__(name, 10)
            self.fingerprint = fingerprint

    config = drt.ReaderConfig(seed=0, prefetch_size=4)
    one = runtime.from_cache_sources([Printed("f", "v1")], base, reader_config=config)
    assert isinstance(one, drt.CacheSourcesDatasetSuccess), one
    two = runtime.from_cache_sources([Printed("f", "v2")], base, reader_config=config)
    assert isinstance(two, drt.CacheSourcesDatasetError)
    assert "stale cache" in two.message and "v1" in two.message


def test_failed_upload_publishes_nothing(runtime, s3_bucket, shard_cache, monkeypatch) -> None:
    from dataset_rt import remote

    calls = {"n": 0}
    real = remote._put_file

    def failing(obstore: Any, store: Any, key: str, path: Path) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise ConnectionResetError("connection reset by peer (injected)")
        real(obstore, store, key, path)

    monkeypatch.setattr(remote, "_put_file", failing)
    result = runtime.write_cache([Numbers("x", 200, 97)], f"{s3_bucket}/fail", writer_config=WRITER)
    assert isinstance(result[0], drt.CacheWriteError), result
    message = result[0].message
    assert "nothing was published" in message and "deleted" in message
    assert listing(f"{s3_bucket}/fail") == []
    with pytest.raises(ValueError, match="no cache at"):
        runtime.cached_dataset([f"{s3_bucket}/fail/x"], reader_config=drt.ReaderConfig(seed=0))


def test_an_upload_in_progress_is_never_overwritten(runtime, s3_bucket, shard_cache) -> None:
    """Another writer's lock object: the second writer uploads nothing, deletes nothing,
    and says who holds the URL; once the first one published, the cache path exists."""
    base = f"{s3_bucket}/race"
    put(f"{base}/n/.dataset-rt-upload", b"host pid 1 2026-12-07T00:00:00Z token")
    put(f"{base}/n/shards/000000.bin", b"the first writer's bytes")
    result = runtime.write_cache([Numbers("n", 40)], base, writer_config=WRITER)
    assert isinstance(result[0], drt.CacheWriteError), result
    message = result[0].message
    assert message.startswith(f"cache path {base}/n is being written by another writer (host")
    assert "nothing was uploaded" in message and f"aws s3 rm --recursive {base}/n/" in message
    assert get(f"{base}/n/shards/000000.bin") == b"the first writer's bytes"
    assert listing(f"{base}/n") == ["race/n/.dataset-rt-upload", "race/n/shards/000000.bin"]
    put(f"{base}/n/manifest.json", b"{}")
    again = runtime.write_cache([Numbers("n", 40)], base, writer_config=WRITER)
    assert again == [drt.CacheWriteError("n", f"cache path already exists: {base}/n")]


def test_an_upload_holds_its_lock_and_lets_go(runtime, s3_bucket, shard_cache, monkeypatch) -> None:
    from dataset_rt import remote

    seen: list[list[str]] = []
    real = remote._put_file

    def watching(obstore: Any, store: Any, key: str, path: Path) -> None:
        seen.append(listing(f"{s3_bucket}/lock/x"))
        real(obstore, store, key, path)

    monkeypatch.setattr(remote, "_put_file", watching)
    result = runtime.write_cache([Numbers("x", 100, 97)], f"{s3_bucket}/lock", writer_config=WRITER)
    assert isinstance(result[0], drt.CacheWriteSuccess), result
    lock = "lock/x/.dataset-rt-upload"
    assert seen and all(lock in names for names in seen)
    assert lock not in listing(f"{s3_bucket}/lock/x")


def test_transient_upload_failures_are_retried(
    runtime, s3_bucket, shard_cache, monkeypatch
) -> None:
    from dataset_rt import remote

    calls = {"n": 0}
    real = remote._put_file

    def flaky(obstore: Any, store: Any, key: str, path: Path) -> None:
        calls["n"] += 1
        if calls["n"] in (2, 3):
            raise RuntimeError("Generic S3 error: error sending request (injected): 503 SlowDown")
        real(obstore, store, key, path)

    monkeypatch.setattr(remote, "_put_file", flaky)
    base = f"{s3_bucket}/flaky"
    result = runtime.write_cache([Numbers("x", 200, 97)], base, writer_config=WRITER)
    assert result == [drt.CacheWriteSuccess("x", f"{base}/x")]  # type: ignore[arg-type]
    dataset = runtime.cached_dataset([f"{base}/x"], reader_config=drt.ReaderConfig(seed=0))
    assert len(dataset) == 200 and sum(1 for _ in dataset) == 200


def test_a_conditional_put_whose_answer_was_lost_counts_as_done(
    runtime, s3_bucket, shard_cache, monkeypatch
) -> None:
    """The lock's and the manifest's create-only puts store their object, then the
    connection drops: the retry finds the object, with this writer's bytes, and goes on."""
    import obstore

    real = obstore.put
    failed: set[str] = set()

    def answer_lost(store: Any, key: str, data: Any, **options: Any) -> Any:
        result = real(store, key, data, **options)
        if options.get("mode") == "create" and key not in failed:
            failed.add(key)
            raise RuntimeError("Generic S3 error: error sending request (injected)")
        return result

    monkeypatch.setattr(obstore, "put", answer_lost)
    base = f"{s3_bucket}/lost"
    result = runtime.write_cache([Numbers("x", 50)], base, writer_config=WRITER)
    assert result == [drt.CacheWriteSuccess("x", f"{base}/x")]  # type: ignore[arg-type]
    assert failed == {"lost/x/.dataset-rt-upload", "lost/x/manifest.json"}
    assert "lost/x/.dataset-rt-upload" not in listing(f"{base}/x")
    dataset = runtime.cached_dataset([f"{base}/x"], reader_config=drt.ReaderConfig(seed=0))
    assert sum(1 for _ in dataset) == 50
    # The same lock taken that way, then a put that fails for good: the cleanup deletes
    # the lock too (it is this writer's).
    from dataset_rt import remote

    def refused(obstore: Any, store: Any, key: str, path: Path) -> None:
        raise RuntimeError("Generic S3 error: 400 Bad Request (injected)")

    monkeypatch.setattr(remote, "_put_file", refused)
    failed.clear()
    result = runtime.write_cache([Numbers("y", 50)], base, writer_config=WRITER)
    assert isinstance(result[0], drt.CacheWriteError), result
    assert failed == {"lost/y/.dataset-rt-upload"}
    assert listing(f"{base}/y") == []


def test_a_failed_uploads_cleanup_lets_go_of_the_lock_last(
    runtime, s3_bucket, shard_cache, monkeypatch
) -> None:
    """Until the lock is gone no other writer starts: deleting it first let a second
    writer put the keys the cleanup was still deleting, and publish a cache without them."""
    import obstore

    from dataset_rt import remote

    calls = {"n": 0}
    real_put, real_delete = remote._put_file, obstore.delete
    deleted: list[str] = []

    def failing(obstore_: Any, store: Any, key: str, path: Path) -> None:
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("Generic S3 error: 400 Bad Request (injected)")
        real_put(obstore_, store, key, path)

    def recording(store: Any, key: str) -> None:
        deleted.append(key)
        real_delete(store, key)

    monkeypatch.setattr(remote, "_put_file", failing)
    monkeypatch.setattr(obstore, "delete", recording)
    result = runtime.write_cache(
        [Numbers("x", 200, 97)], f"{s3_bucket}/order", writer_config=WRITER
    )
    assert isinstance(result[0], drt.CacheWriteError), result
    assert len(deleted) == 6 and deleted[-1] == "order/x/.dataset-rt-upload", deleted
    assert listing(f"{s3_bucket}/order") == []


def test_ctrl_c_during_an_upload_deletes_what_it_uploaded(
    runtime, s3_bucket, shard_cache, monkeypatch
) -> None:
    """SIGINT while a put is in flight (here: right after one stored its object): the
    upload stops at the next request, deletes every object it put (the lock too), and
    the KeyboardInterrupt is raised unchanged."""
    import signal
    import threading

    from dataset_rt import remote

    calls = {"n": 0}
    real = remote._put_file
    main = threading.main_thread().ident

    def interrupted(obstore: Any, store: Any, key: str, path: Path) -> None:
        real(obstore, store, key, path)
        calls["n"] += 1
        if calls["n"] == 3:
            signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.5)  # the interrupt lands while this put is still "in flight"

    monkeypatch.setattr(remote, "_put_file", interrupted)
    base = f"{s3_bucket}/sigint"
    with pytest.raises(KeyboardInterrupt):
        runtime.write_cache([Numbers("x", 200, 97)], base, writer_config=WRITER)
    assert calls["n"] == 3
    assert listing(base) == []


def test_upload_errors_are_results_naming_the_url(
    runtime, s3_bucket, shard_cache, monkeypatch, tmp_path
) -> None:
    """A missing bucket, a bad URL, an unusable local directory: one CacheWriteError per
    source (no exception, no client debug dump)."""
    missing = runtime.write_cache([Numbers("x", 10)], "s3://no-such-bucket/p", writer_config=WRITER)
    assert isinstance(missing[0], drt.CacheWriteError), missing
    assert missing[0].message.startswith(
        "upload to s3://no-such-bucket/p/x failed: the bucket of s3://no-such-bucket/p/x does not"
    )
    assert "Debug source" not in missing[0].message
    bad = runtime.write_cache([Numbers("x", 10)], "s3://", writer_config=WRITER)
    assert isinstance(bad[0], drt.CacheWriteError), bad
    assert bad[0].message.startswith("cannot check s3:") and "URL error" in bad[0].message
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("DATASET_RT_CACHE_DIR", str(tmp_path / "a-file"))
    unusable = runtime.write_cache([Numbers("x", 10)], f"{s3_bucket}/u", writer_config=WRITER)
    assert isinstance(unusable[0], drt.CacheWriteError), unusable
    assert unusable[0].message.startswith("I/O error: cannot stage uploads in ")
    with pytest.raises(ValueError, match=f"duplicate generated cache path: {s3_bucket}/d/x$"):
        runtime.write_cache([Numbers("x", 1), Numbers("x", 1)], f"{s3_bucket}/d/")


def test_dead_writers_staging_is_swept(runtime, s3_bucket, shard_cache) -> None:
    """A writer killed mid-write leaves its uploads/write-* directory: the next writer
    removes it once its lock is free and it is a minute old; a live writer's stays."""
    import fcntl

    uploads = shard_cache / "uploads"
    dead, live, young = uploads / "write-dead", uploads / "write-live", uploads / "write-young"
    for directory in (dead, live, young):
        (directory / "tmp" / "a.1.drt").mkdir(parents=True)
        (directory / "tmp" / "a.1.drt" / "index.bin").write_bytes(b"")
    old = time.time() - 120
    for directory in (dead, live):
        os.utime(directory, (old, old))
    held = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = runtime.write_cache([Numbers("x", 10)], f"{s3_bucket}/sweep", writer_config=WRITER)
        assert isinstance(result[0], drt.CacheWriteSuccess), result
        assert sorted(p.name for p in uploads.iterdir()) == ["write-live", "write-young"]
    finally:
        os.close(held)


def test_validated_reuse_of_a_url_checks_every_shard(runtime, s3_bucket, shard_cache) -> None:
    base = f"{s3_bucket}/v"
    config = drt.ReaderConfig(seed=0, prefetch_size=4)
    first = runtime.write_cache([Numbers("n", 100, 97)], base, writer_config=WRITER)
    assert isinstance(first[0], drt.CacheWriteSuccess), first
    shard = f"{base}/n/shards/000001.bin"
    data = bytearray(get(shard))
    data[-1] ^= 0xFF
    put(shard, bytes(data))
    validated = drt.WriterConfig(max_shard_bytes=2000, validate_cache=True)
    result = runtime.from_cache_sources(
        [Numbers("n", 100, 97)], base, reader_config=config, writer_config=validated
    )
    assert isinstance(result, drt.CacheSourcesDatasetError), result
    assert result.results[0].message.startswith(f"checksum mismatch for {shard}")


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (the CLI's progress lines go to one)."""

    def isatty(self) -> bool:
        return True


def test_cli_verify_checks_the_server_not_local_copies(
    runtime, s3_bucket, shard_cache, monkeypatch
) -> None:
    from dataset_rt.cli import main

    base = f"{s3_bucket}/cv"
    assert isinstance(
        runtime.write_cache([Numbers("n", 100, 97)], base, writer_config=WRITER)[0],
        drt.CacheWriteSuccess,
    )
    out = io.StringIO()
    assert main(["verify", "--quiet", f"{base}/n"], out) == 0, out.getvalue()
    # On a terminal, a line says what the open does before the records pass reports.
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["verify", f"{base}/n"], io.StringIO()) == 0
    progress = terminal.getvalue()
    assert f"verify {base}/n: downloading and verifying every file ..." in progress
    assert f"verify {base}/n: 100/100 samples" in progress
    assert progress.endswith("\r\x1b[2K")
    monkeypatch.undo()
    # Every shard is now in this machine's shard cache, intact; the server's copy is not.
    dataset = runtime.cached_dataset([f"{base}/n"], reader_config=drt.ReaderConfig(seed=0))
    assert sum(1 for _ in dataset) == 100
    shard = f"{base}/n/shards/000001.bin"
    data = bytearray(get(shard))
    data[-1] ^= 0xFF
    put(shard, bytes(data))
    out = io.StringIO()
    assert main(["verify", "--quiet", f"{base}/n"], out) == 1
    assert f"checksum mismatch for {shard}" in out.getvalue()


def test_cli_verify_names_every_damaged_file_on_the_server(runtime, s3_bucket, shard_cache) -> None:
    """As for a local cache, a FAIL line per damaged or missing object, in the order a
    validated open checks them (metadata.arrow, then shard by shard); the API's
    validate_cache=True still stops at the first."""
    import obstore

    from dataset_rt.cli import main

    url = f"{s3_bucket}/ce/n"
    assert isinstance(
        runtime.write_cache([Numbers("n", 100, 97)], f"{s3_bucket}/ce", writer_config=WRITER)[0],
        drt.CacheWriteSuccess,
    )
    for name in ("metadata.arrow", "shards/000004.bin"):
        data = bytearray(get(f"{url}/{name}"))
        data[len(data) // 2] ^= 0x01
        put(f"{url}/{name}", bytes(data))
    obstore.delete(*obstore_store(f"{url}/shards/000002.bin"))
    out = io.StringIO()
    assert main(["verify", "--quiet", url], out) == 1
    changed = "the object changed on the server since its manifest was written"
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == f"FAIL {url}: checksum mismatch for {url}/metadata.arrow: {changed}"
    assert lines[1].startswith(f"FAIL {url}: no object at {url}/shards/000002.bin: ")
    assert lines[2] == f"FAIL {url}: checksum mismatch for {url}/shards/000004.bin: {changed}"
    validated = drt.ReaderConfig(seed=0, validate_cache=True)
    with pytest.raises(ValueError) as first:
        runtime.cached_dataset([url], reader_config=validated)
    assert str(first.value) == f"checksum mismatch for {url}/metadata.arrow: {changed}"


# ------------------------------------------------------------------------ faults


def test_no_cache_at_url(runtime, s3_bucket, shard_cache) -> None:
    with pytest.raises(ValueError, match=rf"no cache at {s3_bucket}/nothing/here: "):
        runtime.cached_dataset(
            [f"{s3_bucket}/nothing/here"], reader_config=drt.ReaderConfig(seed=0)
        )


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("sss3://bucket/c", "sss3://bucket/c/manifest.json"),
        ("s3:///c", "s3:///c/manifest.json"),
        ("s3://", "s3:///manifest.json"),
    ],
)
def test_a_url_the_client_cannot_use_is_one_line_naming_it(
    runtime, s3_bucket, shard_cache, url: str, named: str
) -> None:
    """An unknown scheme or a URL without a bucket fails with one line naming the URL (not
    the client's multi-line debug dump, and ``s3://`` not cut to ``s3:``)."""
    with pytest.raises(RuntimeError) as info:
        runtime.cached_dataset([url], reader_config=drt.ReaderConfig(seed=0))
    message = str(info.value)
    assert "\n" not in message and "Debug" not in message
    assert message.startswith(f"object store error for {named}: ")


@pytest.mark.parametrize("missing", ["index.bin", "metadata.arrow", "shards/000001.bin"])
def test_a_file_missing_on_the_server_is_an_io_error_as_locally(
    runtime, s3_bucket, shard_cache, missing: str
) -> None:
    """A cache whose other files are not all on the server: RuntimeError naming the URL,
    the type a file missing from a local cache raises."""
    import obstore

    source = Numbers("gap", 300, 97)
    config = WRITER
    [result] = runtime.write_cache([source], f"{s3_bucket}/gaps", writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    store, key = obstore_store(f"{s3_bucket}/gaps/gap/{missing}")
    obstore.delete(store, key)
    with pytest.raises(RuntimeError, match=rf"^no object at {s3_bucket}/gaps/gap/{missing}: "):
        dataset = runtime.cached_dataset(
            [f"{s3_bucket}/gaps/gap"], reader_config=drt.ReaderConfig(seed=0)
        )
        for _ in dataset:
            pass


def test_access_denied_names_the_credentials(runtime, shard_cache) -> None:
    require_remote_packages()
    server = S3Server(enforce_auth=True)
    server.start()
    try:
        with client_env(server.env()):
            with pytest.raises(
                RuntimeError, match=r"access denied to s3://locked/c/manifest.json: .*credentials"
            ):
                runtime.cached_dataset(["s3://locked/c"], reader_config=drt.ReaderConfig(seed=0))
    finally:
        server.stop()


def test_connection_refused_is_retried_then_names_the_url(runtime, s3_server, shard_cache) -> None:
    env = s3_server.env() | {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    with client_env(env):
        with pytest.raises(
            RuntimeError,
            match=r"cannot read s3://nobody/c/manifest.json: still failing after 6 attempts",
        ):
            runtime.cached_dataset(["s3://nobody/c"], reader_config=drt.ReaderConfig(seed=0))


def test_server_stopped_mid_read(runtime, shard_cache, tmp_path) -> None:
    """The manifest, index and metadata are fetched; then the server goes away: the read
    fails with the shard's URL after the retries, and nothing partial stays cached."""
    require_remote_packages()
    server = S3Server()
    server.start()
    try:
        server.create_bucket("mid")
        with client_env(server.env()):
            runtime.write_cache([Numbers("m", 100, 97)], "s3://mid/p", writer_config=WRITER)
            ds = runtime.cached_dataset(
                ["s3://mid/p/m"], reader_config=drt.ReaderConfig(seed=0, prefetch_size=4)
            )
            server.stop()
            with pytest.raises(
                RuntimeError, match=r"cannot read s3://mid/p/m/shards/\S+: still failing"
            ):
                list(ds)
    finally:
        server.stop()
    assert not list((shard_cache / "shards").glob("*.tmp"))
    assert not shard_files(shard_cache)


@pytest.mark.parametrize("change", ["same_size", "truncated"])
def test_object_changed_behind_the_reader(runtime, s3_bucket, shard_cache, change) -> None:
    base = f"{s3_bucket}/chg"
    runtime.write_cache([Numbers("c", 100, 97)], base, writer_config=WRITER)
    ds = runtime.cached_dataset([f"{base}/c"], reader_config=drt.ReaderConfig(seed=0))
    manifest = json.loads(get(f"{base}/c/manifest.json"))
    name = manifest["shards"][0]["name"] if "shards" in manifest else None
    assert name is not None
    url = f"{base}/c/shards/{name}"
    old = get(url)
    put(url, bytes(len(old)) if change == "same_size" else old[:-10])
    message = (
        rf"checksum mismatch for {url}: the object changed"
        if change == "same_size"
        else rf"{url} is {len(old) - 10} bytes but the manifest says {len(old)}"
    )
    with pytest.raises(ValueError, match=message):
        list(ds)
    changed = manifest["shards"][0]["sha256"]
    cached = {f.stem for f in shard_files(shard_cache)}
    assert changed not in cached  # other shards may be cached
    # Nothing of the failed download is left. (Other shards' fetches ahead may still be
    # running, each in a temporary file of its own until it is verified and renamed.)
    assert not list((shard_cache / "shards").glob(f"{changed}*.tmp"))
    # The bytes come back: the same dataset reads again, identical to before.
    put(url, old)
    assert len(list(ds)) == 100


def test_get_item_reads_byte_ranges_on_a_cold_shard_cache(
    runtime, s3_bucket, shard_cache, tmp_path
) -> None:
    """get_item and get_items on shards that are not in the local shard cache read the
    records' byte ranges: the same samples as the local copy, and no shard file; a shard
    that is in the shard cache is read from there."""
    base, local = write_both(runtime, tmp_path, s3_bucket, count=120)
    config = drt.ReaderConfig(seed=4, prefetch_size=8, shuffle=False)
    remote_ds = runtime.cached_dataset([f"{base}/a", f"{base}/b"], reader_config=config)
    local_ds = runtime.cached_dataset([local / "a", local / "b"], reader_config=config)
    ids = [remote_ds._handle.cache_info(i).cache_id for i in range(2)]
    for cache_id, sample_id in [(ids[0], 119), (ids[1], 3), (ids[0], 0), (ids[0], 57)]:
        r, l_ = remote_ds.get_item(cache_id, sample_id), local_ds.get_item(cache_id, sample_id)
        assert (r.data, r.metadata, r.sample_id) == (l_.data, l_.metadata, l_.sample_id)
    wanted = [(ids[0], s) for s in (5, 90, 6, 5)] + [(ids[1], 39)]
    cache_ids, sample_ids = zip(*wanted, strict=True)
    got = remote_ds.get_items(cache_ids, sample_ids)
    want = local_ds.get_items(cache_ids, sample_ids)
    assert got.metadata.to_dicts() == want.metadata.to_dicts()
    assert [got.payload(i) for i in range(len(got))] == [want.payload(i) for i in range(len(want))]
    assert not shard_files(shard_cache)
    stats = remote_ds._handle.io_stats()
    # One range per get_item, and per run of adjacent records of get_items (5 and 6).
    assert stats.lookup_reads == 4 + 3
    # Ordered iteration fetches whole shards; lookups then read them locally.
    assert rows(remote_ds) == rows(local_ds)
    assert shard_files(shard_cache)
    r = remote_ds.get_item(ids[0], 119)
    assert r.data == local_ds.get_item(ids[0], 119).data


def test_validate_cache_reads_whole_verified_shards(
    runtime, s3_bucket, shard_cache, monkeypatch
) -> None:
    """validate_cache: no byte ranges (no checksum covers them): get_item and shuffled
    reading over the budget fetch whole shards, verified against the manifest."""
    monkeypatch.setenv("DATASET_RT_SHARD_CACHE_BYTES", "6000")
    runtime.write_cache([Numbers("v", 200, 97)], f"{s3_bucket}/val", writer_config=WRITER)
    config = drt.ReaderConfig(seed=1, shuffle=True, validate_cache=True)
    ds = runtime.cached_dataset([f"{s3_bucket}/val/v"], reader_config=config)
    assert ds.get_item(ds._handle.cache_info(0).cache_id, 5).metadata["i"] == 5
    assert shard_files(shard_cache)
    samples = list(ds)
    assert all(s.data == bytes([s.metadata["i"] % 251]) * 97 for s in samples)


@pytest.mark.parametrize("mode", ["shuffled", "permutation"])
def test_shuffled_reads_over_the_budget_read_byte_ranges(
    runtime, s3_bucket, shard_cache, tmp_path, io_backend, mode, monkeypatch
) -> None:
    """Shuffled reading of a cache far larger than the shard budget reads each record's
    byte range (a whole shard would be evicted before the plan came back to most of it):
    two epochs equal the local copy's, and no shard is fetched whole."""
    monkeypatch.setenv("DATASET_RT_SHARD_CACHE_BYTES", "6000")  # 3 of its ~26 shards
    base, local = write_both(runtime, tmp_path, s3_bucket, count=400)
    config = READ_MODES[mode].model_copy(update={"io_backend": io_backend})
    remote_ds = runtime.cached_dataset([f"{base}/a"], reader_config=config)
    local_ds = runtime.cached_dataset([local / "a"], reader_config=config)
    for _ in range(2):
        assert rows(remote_ds) == rows(local_ds)
    got = [b.metadata.to_dicts() for b in remote_ds.iter_batches(64)]
    assert got == [b.metadata.to_dicts() for b in local_ds.iter_batches(64)]
    assert not shard_files(shard_cache)
    assert not list((shard_cache / "shards").glob("*.tmp"))


def test_object_replaced_between_ranges(runtime, s3_bucket, shard_cache) -> None:
    """A shard object replaced on the server after a reader's first range of it: the next
    range is refused ("changed on the server", from the ETag pinned at open), never bytes
    of the other version; a dataset opened afterwards reads the new state."""
    base = f"{s3_bucket}/rep"
    runtime.write_cache([Numbers("c", 100, 97)], base, writer_config=WRITER)
    ds = runtime.cached_dataset([f"{base}/c"], reader_config=drt.ReaderConfig(seed=0))
    cache_id = ds._handle.cache_info(0).cache_id
    manifest = json.loads(get(f"{base}/c/manifest.json"))
    url = f"{base}/c/shards/{manifest['shards'][0]['name']}"
    first = ds.get_item(cache_id, 0)
    assert first.metadata["i"] == 0
    old = get(url)
    put(url, bytes(len(old)))  # same size, other bytes: a new ETag
    with pytest.raises(ValueError, match=rf"{url} changed on the server while it was read"):
        ds.get_item(cache_id, 1)
    assert not shard_files(shard_cache)
    # Put back: the bytes (and the ETag) are the old ones again; reads go on.
    put(url, old)
    assert ds.get_item(cache_id, 1).metadata["i"] == 1


def test_shard_larger_than_budget(runtime, s3_bucket, shard_cache, monkeypatch) -> None:
    monkeypatch.setenv("DATASET_RT_SHARD_CACHE_BYTES", "100")
    runtime.write_cache([Numbers("s", 100, 97)], f"{s3_bucket}/b", writer_config=WRITER)
    config = drt.ReaderConfig(seed=0, shuffle=False)
    ds = runtime.cached_dataset([f"{s3_bucket}/b/s"], reader_config=config)
    with pytest.raises(ValueError, match=r"shard cache budget \(100 bytes\) is smaller than"):
        list(ds)
    # Shuffled reading of a cache larger than the budget reads byte ranges: no shard is
    # fetched whole, so a budget smaller than a shard does not stop it.
    config = drt.ReaderConfig(seed=0, shuffle=True)
    ds = runtime.cached_dataset([f"{s3_bucket}/b/s"], reader_config=config)
    samples = list(ds)
    assert len(samples) == 100
    assert all(s.data == bytes([s.metadata["i"] % 251]) * 97 for s in samples)
    assert not shard_files(shard_cache)


SUBPROCESS_PRELUDE = """
import json, os, resource, signal, sys
sys.path.insert(0, {tests!r})
import dataset_rt as drt
"""


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    tests = str(Path(__file__).parent)
    script = SUBPROCESS_PRELUDE.format(tests=tests) + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )


def test_disk_full_in_the_shard_cache(runtime, s3_bucket, shard_cache) -> None:
    """A write refused by the file system (here RLIMIT_FSIZE: EFBIG, as ENOSPC would be)
    fails the read with the shard cache's path; no partial file stays."""
    runtime.write_cache([Numbers("d", 100, 97)], f"{s3_bucket}/d", writer_config=WRITER)
    code = """
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    rt = drt.DatasetRuntime(num_workers=1)
    ds = rt.cached_dataset([sys.argv[1] if len(sys.argv) > 1 else os.environ["URL"]],
                           reader_config=drt.ReaderConfig(seed=0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (500, 500))
    try:
        list(ds)
    except RuntimeError as exc:
        print("ERROR", exc)
    """
    env = dict(os.environ, URL=f"{s3_bucket}/d/d")
    out = run_python(code, env)
    assert "ERROR cannot write the local cache" in out.stdout, out.stdout + out.stderr
    assert "File too large (os error 27)" in out.stdout, out.stdout
    assert str(shard_cache / "shards") in out.stdout
    assert not list((shard_cache / "shards").glob("*.tmp"))
    assert not shard_files(shard_cache)


def test_processes_share_one_shard_cache(runtime, s3_bucket, shard_cache, tmp_path) -> None:
    base, local = write_both(runtime, tmp_path, s3_bucket, count=200)
    code = """
    rt = drt.DatasetRuntime(num_workers=2)
    config = drt.ReaderConfig(seed=4, shuffle=True)
    ds = rt.cached_dataset([os.environ["URL"]], reader_config=config)
    print(json.dumps([[s.data.hex(), s.sample_id] for s in ds]))
    """
    env = dict(os.environ, URL=f"{base}/a")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                SUBPROCESS_PRELUDE.format(tests=str(Path(__file__).parent)) + textwrap.dedent(code),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    local_ds = runtime.cached_dataset(
        [local / "a"], reader_config=drt.ReaderConfig(seed=4, shuffle=True)
    )
    want = [[s.data.hex(), s.sample_id] for s in local_ds]
    for (out, err), p in zip(outputs, procs):
        assert p.returncode == 0, err
        assert json.loads(out) == want
    manifest = json.loads((local / "a" / "manifest.json").read_text())
    assert {f.stem for f in shard_files(shard_cache)} == {s["sha256"] for s in manifest["shards"]}
    assert not list((shard_cache / "shards").glob("*.tmp"))


def test_cli_reads_urls(runtime, s3_bucket, shard_cache, tmp_path) -> None:
    from dataset_rt.cli import main

    base, local = write_both(runtime, tmp_path, s3_bucket, count=60)
    outputs = {}
    for where in (f"{base}/a", str(local / "a")):
        runs = {}
        for argv in (["inspect", "--json", where], ["head", "-n", "3", where], ["stats", where]):
            out = io.StringIO()
            assert main(argv, out) == 0, argv
            runs[argv[0]] = out.getvalue().replace(where, "<cache>")
        out = io.StringIO()
        assert main(["verify", "--quiet", where], out) == 0
        assert out.getvalue().startswith(f"OK   {where}: 60 samples")
        outputs[where] = runs
    remote_run, local_run = outputs.values()
    assert remote_run == local_run
    # A missing cache is a failure naming the URL.
    out = io.StringIO()
    assert main(["verify", "--quiet", f"{base}/missing"], out) == 1
    assert f"no cache at {base}/missing" in out.getvalue()


@pytest.mark.parametrize("shuffle", [False, True])
def test_reading_fetches_the_next_shards_in_plan_order(
    runtime, s3_bucket, shard_cache, tmp_path, shuffle, monkeypatch
) -> None:
    """Look-ahead follows the plan: after the first sample, the shards of the positions
    the sampler draws next are fetched in the background in that order (at most four
    fetches at once), in ordered and shuffled reading alike; get_item fetches only the
    record it reads (a byte range)."""
    source = Numbers("r", 300, 97)
    runtime = drt.DatasetRuntime(num_workers=8)  # fetch-ahead: half the workers, at most 4
    runtime.write_cache([source], f"{s3_bucket}/ra", writer_config=WRITER)
    runtime.write_cache([source], tmp_path / "local", writer_config=WRITER)
    url = f"{s3_bucket}/ra/r"
    config = drt.ReaderConfig(seed=3, shuffle=shuffle, prefetch_size=1)
    # (Shuffled: in ordered reading, opening a shard also asks for the next two.)
    lookup = runtime.cached_dataset(
        [url], reader_config=config.model_copy(update={"shuffle": True})
    )
    lookup.get_item(lookup._handle.cache_info(0).cache_id, 0)
    time.sleep(0.5)
    assert not shard_files(shard_cache)  # a byte-range read, no shard fetched
    # The plan: the local copy's sample ids in stream order, and their shards.
    local = tmp_path / "local" / "r"
    order = [s.sample_id for s in runtime.cached_dataset([local], reader_config=config)]
    index = (local / "index.bin").read_bytes()
    manifest = json.loads((local / "manifest.json").read_text())
    plan: list[str] = []
    for sample_id in order:
        sha = manifest["shards"][
            int.from_bytes(index[24 * sample_id : 24 * sample_id + 8], "little")
        ]["sha256"]
        if sha not in plan:
            plan.append(sha)
    assert len(plan) > 8

    fresh = tmp_path / "fresh-cache"
    monkeypatch.setenv("DATASET_RT_CACHE_DIR", str(fresh))
    dataset = runtime.cached_dataset([url], reader_config=config)
    it = iter(dataset)
    next(it)
    seen: set[str] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until nothing more arrives for a while
        time.sleep(0.3)
        now = {f.stem for f in shard_files(fresh)}
        if now == seen and len(now) >= 4:
            break
        seen = now
    assert len(seen) >= 4
    assert seen == set(plan[: len(seen)]), "fetched in plan order"
    assert [s.sample_id for s in it] == order[1:]


def test_slow_server_keeps_memory_bounded(runtime, s3_server, s3_bucket, shard_cache) -> None:
    """Through a proxy that serves about 8 MB/s per connection, a 48 MiB cache (three
    16 MiB shards) reads correctly, and the reading process's peak memory grows by far
    less than the data: shards go to disk in bounded ranges."""
    from remote_server import SlowProxy

    big = drt.WriterConfig(max_shard_bytes=16 << 20)
    runtime.write_cache([Numbers("big", 48, 1 << 20)], f"{s3_bucket}/slow", writer_config=big)
    proxy = SlowProxy(s3_server.port, 8_000_000)
    try:
        code = """
        def hwm():
            for line in open("/proc/self/status"):
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        rt = drt.DatasetRuntime(num_workers=2)
        config = drt.ReaderConfig(seed=0, shuffle=False, prefetch_size=2)
        ds = rt.cached_dataset([os.environ["URL"]], reader_config=config)
        before = hwm()
        n = 0
        for sample in ds:
            assert sample.data == bytes([sample.metadata["i"] % 251]) * (1 << 20)
            n += 1
        print(json.dumps({"n": n, "growth": hwm() - before}))
        """
        env = dict(
            os.environ,
            URL=f"{s3_bucket}/slow/big",
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}",
        )
        out = run_python(code, env)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        proxy.close()
    assert result["n"] == 48
    # No buffer per range: the client streams 1 MiB pieces into the shard file (whose
    # pages count while mapped for the hash: at most the shards in flight, 16 MiB each
    # here), plus the reader's prefetch_size records.
    assert result["growth"] < 40 << 20, result


def test_a_dataset_keeps_the_callbacks_of_its_remote(
    runtime, s3_bucket, shard_cache, tmp_path, monkeypatch
) -> None:
    """The native remote is reference counted, but its callbacks are Python objects: a
    dataset (and its lookups and iterators) keeps them alive, so dropping every other
    reference to the Remote leaves the dataset usable (and its close safe)."""
    from dataset_rt import remote as remote_mod

    base, local = write_both(runtime, tmp_path, s3_bucket, count=120)
    monkeypatch.setattr(remote_mod, "_REMOTES", {})
    config = drt.ReaderConfig(seed=4, shuffle=False)
    remote_ds = runtime.cached_dataset([f"{base}/a"], reader_config=config)
    remote_mod._REMOTES.clear()  # the dataset holds the only reference now
    gc.collect()
    local_ds = runtime.cached_dataset([local / "a"], reader_config=config)
    cache_id = remote_ds._handle.cache_info(0).cache_id
    for sample_id in (3, 119):  # byte ranges, through the callbacks
        got = remote_ds.get_item(cache_id, sample_id)
        assert got.data == local_ds.get_item(cache_id, sample_id).data
    del remote_ds
    gc.collect()


@pytest.mark.parametrize("call", ["get_item", "get_items"])
def test_an_interrupt_in_a_transport_read_propagates(
    runtime, s3_bucket, shard_cache, tmp_path, monkeypatch, call
) -> None:
    """A KeyboardInterrupt raised while the transport reads on the calling thread (a
    Ctrl-C landing in the callback) fails that read and reaches the caller unchanged, never
    as an error and never as a sample made of bytes that were not read, also where the
    library does without that read (a fetch ahead that failed is read again); the next
    read works, and no later call raises it again."""
    from dataset_rt import remote as remote_mod

    base, local = write_both(runtime, tmp_path, s3_bucket, count=120)
    calls: list[int] = []
    armed = [False]
    caller = threading.get_ident()

    def interrupting_once(read: Any) -> Any:
        def interrupted_once(self, handle, offset, *args):
            if armed[0] and threading.get_ident() == caller:
                calls.append(offset)
                if len(calls) == 1:
                    raise KeyboardInterrupt
            return read(self, handle, offset, *args)

        return interrupted_once

    for name in ("read_into", "read_to_file"):
        read = getattr(remote_mod.ObstoreTransport, name)
        monkeypatch.setattr(remote_mod.ObstoreTransport, name, interrupting_once(read))
    fresh_remotes(monkeypatch)
    config = drt.ReaderConfig(seed=4, shuffle=False)
    remote_ds = runtime.cached_dataset([f"{base}/a"], reader_config=config)
    local_ds = runtime.cached_dataset([local / "a"], reader_config=config)
    cache_id = remote_ds._handle.cache_info(0).cache_id
    ids = list(range(7, 60))
    armed[0] = True
    with pytest.raises(KeyboardInterrupt):
        if call == "get_item":
            remote_ds.get_item(cache_id, 7)
        else:
            remote_ds.get_items([cache_id] * len(ids), ids)
    assert calls
    got = remote_ds.get_items([cache_id] * len(ids), ids)
    assert bytes(got.data) == bytes(local_ds.get_items([cache_id] * len(ids), ids).data)
    with pytest.raises(IndexError):
        remote_ds.get_item(cache_id, 10**6)


def test_release_is_called_once_after_the_last_reference(
    runtime, s3_bucket, shard_cache, tmp_path
) -> None:
    """``Remote.set_release`` (``drt_remote_set_release``): the function is called once,
    not while a dataset opened with the remote is open, and after everything is closed
    (fetches ahead included)."""
    from dataset_rt import _native
    from dataset_rt import remote as remote_mod

    base, _ = write_both(runtime, tmp_path, s3_bucket, count=120)
    handle = _native.Remote.open(remote_mod.ObstoreTransport(), tmp_path / "own", 1 << 30)
    calls: list[int] = []
    release = _native.ffi.callback("void(void *)", lambda context: calls.append(1))
    handle.set_release(release)
    config = drt.ReaderConfig(seed=0, shuffle=False)
    dataset = drt.CachedDataset._open(runtime._runtime, [f"{base}/a"], config, handle)
    next(iter(dataset))
    # The Python object stays (its callbacks must outlive every call back: fetches ahead
    # may call after the last dataset closes); the library's reference goes.
    handle.close()
    assert calls == []  # the dataset holds the remote
    del dataset
    gc.collect()
    deadline = time.monotonic() + 30
    while not calls:  # a fetch ahead may still hold it for its last request
        assert time.monotonic() < deadline, "release was never called"
        time.sleep(0.01)
    time.sleep(0.2)
    assert calls == [1]


@pytest.mark.parametrize(
    "without", [("read_into",), ("read_to_file",), ("read_into", "read_to_file")]
)
def test_transport_without_the_optional_reads(
    runtime, s3_bucket, shard_cache, tmp_path, monkeypatch, without
) -> None:
    """A transport without ``read_to_file`` (downloads go through the shard file's
    mapping), without ``read_into``, or with only ``read`` (returning the range's bytes,
    as a third-party transport may) reads the same samples as obstore's full transport."""
    from dataset_rt import remote as remote_mod

    base, local = write_both(runtime, tmp_path, s3_bucket, count=120)
    for name in without:
        monkeypatch.delattr(remote_mod.ObstoreTransport, name)
    fresh_remotes(monkeypatch)
    config = drt.ReaderConfig(seed=5, shuffle=True, prefetch_size=8)
    got = rows(runtime.cached_dataset([f"{base}/a"], reader_config=config))
    want = rows(runtime.cached_dataset([local / "a"], reader_config=config))
    assert got == want
    assert shard_files(shard_cache)
