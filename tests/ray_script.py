"""Run by tests/test_ray.py inside the Ray extra virtualenv (one ray.init for every check).

Usage: python ray_script.py <workdir>. Prints one JSON object with what the pytest side
asserts on. Not collected by pytest (no test_ prefix). ``python ray_script.py <workdir>
--num-workers-3 <gcs address>`` is the second driver one check starts (see
``check_arguments``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import ray
import ray.data

import dataset_rt as drt
from dataset_rt.integrations import ray as drt_ray

WORK = Path(sys.argv[1])
CFG = drt.WriterConfig(show_progress=False, max_shard_bytes=256)


class Source:
    def __init__(self, name: str, n: int, fail_at: int | None = None) -> None:
        self.name = name
        self.n = n
        self.fail_at = fail_at

    def __iter__(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise RuntimeError("task failure")
            yield drt.CacheInput(f"{self.name}-{i}".encode() * 3, {"i": i, "tag": self.name})


class LockedSource(Source):
    """A source that cannot be pickled (it holds a lock)."""

    def __init__(self, name: str, n: int) -> None:
        super().__init__(name, n)
        self.lock = threading.Lock()


def attempt(fn) -> str | None:
    """``None`` when ``fn()`` returns, else ``"<type>: <message>"`` of what it raised."""
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:600]}"
    return None


def described(results: list[object]) -> list[list[str]]:
    """``[type, source_name, message or path]`` per result."""
    return [
        [type(r).__name__, r.source_name, str(getattr(r, "message", getattr(r, "path", "")))]
        for r in results
    ]


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): p.read_bytes().hex()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def leftovers(base: Path) -> list[str]:
    return sorted(str(p.relative_to(base)) for p in (base / "tmp").rglob("*"))


def remote_tree(url: str) -> dict[str, str]:
    """``tree`` of the objects under ``url`` (through the same client as the reader)."""
    import obstore

    from dataset_rt.remote import ObstoreTransport

    store, prefix = ObstoreTransport().locate(url.rstrip("/") + "/")
    keys = sorted(m["path"] for batch in obstore.list(store, prefix) for m in batch)
    return {
        key[len(prefix) :].lstrip("/"): bytes(obstore.get(store, key).bytes()).hex() for key in keys
    }


def read_rows(path: object) -> list[list[object]]:
    rt = drt.DatasetRuntime(num_workers=1)
    config = drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True)
    return [
        [s.sample_id, s.data.decode(), s.metadata]
        for s in rt.cached_dataset([path], reader_config=config)
    ]


def check_urls(out: dict[str, object], base: str, sources: list[Source], ds, failing) -> None:
    """6. ``write_sources`` and ``CacheDatasink`` with a URL base (the moto server that
    tests/test_ray.py started; the client environment is inherited by Ray's workers)."""
    results = drt_ray.write_sources(sources, base + "/sources", writer_config=CFG)
    out["url_sources_results"] = [repr(r) for r in results]
    out["url_sources_identical"] = {
        s.name: remote_tree(f"{base}/sources/{s.name}") == tree(WORK / "local" / s.name)
        for s in sources
    }
    again = drt_ray.write_sources(sources[:1], base + "/sources", writer_config=CFG)
    out["url_sources_again"] = [repr(r) for r in again]
    out["url_duplicate_raised"] = attempt(
        lambda: drt_ray.write_sources([Source("a", 1), Source("a", 1)], base + "/dup")
    )

    sink = drt_ray.CacheDatasink(base + "/sink", "rows", writer_config=CFG)
    ds.write_datasink(sink)
    out["url_sink_result"] = repr(sink.result)
    out["url_sink_rows"] = read_rows(f"{base}/sink/rows")
    # The same files as the Datasink's local commit of the same dataset.
    out["url_sink_identical"] = remote_tree(f"{base}/sink/rows") == tree(WORK / "sink" / "rows")

    sink2 = drt_ray.CacheDatasink(base + "/sink", "failed", writer_config=CFG)
    try:
        failing.write_datasink(sink2)
        out["url_failed_raised"] = None
    except Exception as exc:
        out["url_failed_raised"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    # Only the published cache is left under the base: no fragments, no failed cache.
    out["url_objects"] = sorted({key.split("/")[0] for key in remote_tree(base + "/sink")})
    try:
        ds.write_datasink(drt_ray.CacheDatasink(base + "/sink", "rows", writer_config=CFG))
        out["url_exists_raised"] = None
    except Exception as exc:
        out["url_exists_raised"] = str(exc)[:300]
    try:
        drt_ray.CacheDatasink(base + "/sink", "rows", replace=True)
        out["url_replace_raised"] = None
    except ValueError as exc:
        out["url_replace_raised"] = str(exc)
    uploads = Path(os.environ["DATASET_RT_CACHE_DIR"]) / "uploads"
    out["url_staging_left"] = sorted(p.name for p in uploads.iterdir()) if uploads.exists() else []


def check_order_context(out: dict[str, object], rows: list[dict[str, object]]) -> None:
    """7. The order check uses the DataContext a dataset executes with (the one it was
    created with), not the global one at the time of the write."""
    ctx = ray.data.DataContext.get_current()
    base = WORK / "order"

    def build():
        return ray.data.from_items(rows[:60], override_num_blocks=3).map_batches(
            lambda b: b, batch_format="pyarrow"
        )

    ctx.execution_options.preserve_order = False
    unordered = build()  # keeps preserve_order off
    ctx.execution_options.preserve_order = True
    out["order_late_raised"] = attempt(
        lambda: unordered.write_datasink(drt_ray.CacheDatasink(base, "late", writer_config=CFG))
    )
    out["order_late_exists"] = (base / "late").exists()
    out["order_late_leftovers"] = leftovers(base)

    ordered = build()  # keeps preserve_order on
    ctx.execution_options.preserve_order = False
    sink = drt_ray.CacheDatasink(base, "early", writer_config=CFG)
    out["order_early_raised"] = attempt(lambda: ordered.write_datasink(sink))
    out["order_early_result"] = repr(sink.result)
    if sink.result is not None:
        out["order_early_rows"] = [row[2]["i"] for row in read_rows(base / "early")]
    # Unordered on purpose: accepted whatever the context.
    anyorder = drt_ray.CacheDatasink(base, "any", writer_config=CFG, ordered=False)
    out["order_unordered_raised"] = attempt(lambda: build().write_datasink(anyorder))
    if anyorder.result is not None:
        out["order_unordered_rows"] = sorted(row[2]["i"] for row in read_rows(base / "any"))
    ctx.execution_options.preserve_order = True


def check_arguments(out: dict[str, object]) -> None:
    """8. Bad arguments fail on the driver before any task runs; Ray errors are plain."""
    work = WORK / "args"
    # An unpicklable source: its own error, the others written.
    results: list[object] = []
    out["pickle_raised"] = attempt(
        lambda: results.extend(
            drt_ray.write_sources(
                [Source("first", 5), LockedSource("locked", 5), Source("last", 5)],
                work / "pickle",
                writer_config=CFG,
            )
        )
    )
    out["pickle_results"] = described(results)
    # Datasink names: write_cache's rules and messages, when the sink is created.
    out["sink_names"] = {
        name: attempt(lambda name=name: drt_ray.CacheDatasink(work / "names", name))
        for name in ("", ".", "..", "tmp", "a/b")
    }
    out["sink_names_left"] = (work / "names").exists()
    out["num_workers_raised"] = {
        str(n): attempt(
            lambda n=n: drt_ray.write_sources([Source("a", 3)], work / "nw", num_workers=n)
        )
        for n in (0, 1.5, -1)
    }
    out["num_workers_left"] = (work / "nw").exists()
    out["sink_num_workers_raised"] = attempt(
        lambda: drt_ray.CacheDatasink(work / "nw", "x", num_workers=0)
    )
    # More native threads than any node has CPUs (2 here): still scheduled. From a second
    # driver process, because an unschedulable task blocks ray.get for ever (no signal
    # stops it): the timeout only bounds how long a broken build waits, and killing that
    # driver drops its task.
    address = ray.get_runtime_context().gcs_address
    try:
        proc = subprocess.run(
            [sys.executable, __file__, str(WORK), "--num-workers-3", address],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("BIG ")]
        out["num_workers_big"] = (
            json.loads(lines[-1][len("BIG ") :])
            if lines
            else f"exit status {proc.returncode}: {proc.stderr[-2000:]}"
        )
    except subprocess.TimeoutExpired:
        out["num_workers_big"] = "write_sources(num_workers=3) still waiting after 120 s"
    # The profile of write_sources lists every source, as write_cache's does.
    profiles = {}
    for label in ("ray", "local"):
        path = work / f"{label}-profile.json"
        config = drt.WriterConfig(
            show_progress=False, profiler=drt.WriterProfilerConfig(enabled=True, path=path)
        )
        profiled = [Source("b", 20), Source("a", 20), Source("c", 5)]
        if label == "ray":
            drt_ray.write_sources(profiled, work / label, writer_config=config)
        else:
            drt.DatasetRuntime(num_workers=1).write_cache(
                profiled, work / label, writer_config=config
            )
        try:
            document = json.loads(path.read_text())
        except ValueError as exc:  # tasks writing one file at once can garble it
            profiles[label] = {"keys": [f"unreadable: {exc}"], "sources": []}
            continue
        profiles[label] = {
            "keys": sorted(document),
            "sources": [
                [entry["source_name"], sorted(stage["name"] for stage in entry["stages"])]
                for entry in document["sources"]
            ],
        }
    out["profiles"] = profiles
    out["profile_partials"] = sorted(p.name for p in work.iterdir() if p.name.startswith("."))


def num_workers_3(address: str) -> None:
    """The second driver of ``check_arguments``: ``num_workers=3`` on the 2-CPU cluster."""
    ray.init(address=address, log_to_driver=False)
    results = drt_ray.write_sources(
        [Source("a", 3), Source("b", 3)], WORK / "args" / "big", writer_config=CFG, num_workers=3
    )
    print("BIG " + json.dumps(described(results)))
    ray.shutdown()


def main() -> None:
    out: dict[str, object] = {}
    started = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    out["ray_init_s"] = time.monotonic() - started
    assert "ray" not in sys.modules.get("dataset_rt").__dict__  # import dataset_rt: no ray

    # 1. One task per source, byte-identical to write_cache from the same sources.
    sources = [Source("a", 40), Source("b", 7), Source("c", 1)]
    t = time.monotonic()
    results = drt_ray.write_sources(sources, WORK / "ray", writer_config=CFG)
    out["sources_s"] = time.monotonic() - t
    local = drt.DatasetRuntime(num_workers=1).write_cache(
        sources, WORK / "local", writer_config=CFG
    )
    out["sources_results"] = [repr(r) for r in results]
    out["sources_expected"] = [
        repr(drt.CacheWriteSuccess(s.name, WORK / "ray" / s.name)) for s in sources
    ]
    out["local_results_ok"] = all(isinstance(r, drt.CacheWriteSuccess) for r in local)
    out["sources_identical"] = {
        s.name: tree(WORK / "ray" / s.name) == tree(WORK / "local" / s.name) for s in sources
    }
    out["sources_nonempty"] = all(tree(WORK / "ray" / s.name) for s in sources)

    # 2. A task that raises: an error result, no cache, no staging; the others succeed.
    mixed = drt_ray.write_sources(
        [Source("good", 5), Source("bad", 10, fail_at=4)], WORK / "mixed", writer_config=CFG
    )
    out["mixed_results"] = [repr(r) for r in mixed]
    out["mixed_bad_exists"] = (WORK / "mixed" / "bad").exists()
    out["mixed_leftovers"] = leftovers(WORK / "mixed")

    # 3. The Datasink: every row once, in the dataset's order.
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    n = 300
    rows = [
        {"data": f"row-{i}".encode(), "i": i, "score": i / 7, "even": i % 2 == 0, "s": f"s{i % 5}"}
        for i in range(n)
    ]
    ds = ray.data.from_items(rows, override_num_blocks=6).map_batches(
        lambda b: b, batch_format="pyarrow"
    )
    sink = drt_ray.CacheDatasink(WORK / "sink", "rows", writer_config=CFG)
    t = time.monotonic()
    ds.write_datasink(sink)
    out["sink_s"] = time.monotonic() - t
    out["sink_result"] = repr(sink.result)
    rt = drt.DatasetRuntime(num_workers=1)
    config = drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True)
    read = [
        [s.sample_id, s.data.decode(), s.metadata]
        for s in rt.cached_dataset([WORK / "sink" / "rows"], reader_config=config)
    ]
    out["sink_rows"] = read
    manifest = json.loads((WORK / "sink" / "rows" / "manifest.json").read_text())
    out["sink_shards"] = len(manifest["shards"])
    out["sink_leftovers"] = leftovers(WORK / "sink")

    # 4. A write task that raises: the job fails, nothing is published, staging is gone.
    def explode(batch):
        if 150 in batch["i"].to_pylist():
            raise RuntimeError("boom in a write task")
        return batch

    failing = ray.data.from_items(rows, override_num_blocks=6).map_batches(
        explode, batch_format="pyarrow", max_retries=0
    )
    sink2 = drt_ray.CacheDatasink(WORK / "sink", "failed", writer_config=CFG)
    try:
        failing.write_datasink(sink2)
        out["failed_raised"] = None
    except Exception as exc:  # Ray wraps the task's error
        out["failed_raised"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    out["failed_exists"] = (WORK / "sink" / "failed").exists()
    out["failed_leftovers"] = leftovers(WORK / "sink")

    # 5. Committing onto an existing cache name fails before any task runs.
    try:
        ds.write_datasink(drt_ray.CacheDatasink(WORK / "sink", "rows", writer_config=CFG))
        out["exists_raised"] = None
    except Exception as exc:
        out["exists_raised"] = str(exc)[:300]
    check_order_context(out, rows)
    check_arguments(out)
    base = os.environ.get("DRT_TEST_S3_BASE")
    if base:
        t = time.monotonic()
        check_urls(out, base, sources, ds, failing)
        out["urls_s"] = time.monotonic() - t
    out["total_s"] = time.monotonic() - started
    ray.shutdown()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[2:3] == ["--num-workers-3"]:
        num_workers_3(sys.argv[3])
    else:
        main()
