"""Reading caches on object storage, from a loopback S3 server, next to the limits.

    uv run python benchmarks/remote.py                 # W1 200,000 x 512 B, W2 1,000 x 1 MiB
    uv run python benchmarks/remote.py --quick         # W1 50,000, W2 300
    uv run python benchmarks/remote.py --w1 50000 --w2 200 --no-litdata --workers 4

The S3 server is moto's standalone server on 127.0.0.1 (``tests/remote_server.py``, a dev
dependency), so the numbers measure the client side against one slow-ish Python server:
compare rows with each other, not with a cloud. For W1 and W2 the same records are written
once locally and uploaded with ``write_cache`` to ``s3://bench/...``; then, in one run:

- ``raw parallel fetch``: every object of the cache fetched with the same client (obstore)
  in 8 MiB ranges by ``--fetchers`` threads (the limit of this client and server);
- ``remote ordered|shuffled cold``: ``iter_batches`` over the URL with an empty shard cache
  (a fresh ``DATASET_RT_CACHE_DIR``), ``warm``: the same again with the shard cache full;
- ``local ordered|shuffled``: the local copy (page cache warm);
- ``litdata``: LitData 0.2.76 (its own virtualenv, ``tests/refenv.py``) streaming the same
  records, written with ``optimize`` and uploaded to the same server (unless
  ``--no-litdata``), ``StreamingDataLoader`` with 0 workers: LitData's obstore client
  options replace ``AWS_ALLOW_HTTP``, so the script allows plain HTTP in LitData's module
  state, which DataLoader worker processes would not see (its own prefetch threads
  still fetch in parallel). Its rss column is this process's, not LitData's.

Each line gives samples/s, MB/s and the share of the raw fetch. The load average is
printed at the start and the end; peak RSS (VmHWM) after each dataset_rt row shows memory
stays bounded by the budget's buffers, not the dataset.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
LITDATA = "litdata==0.2.76"
TORCH = "torch==2.13.0"
MiB = 1 << 20


def blob(size: int, i: int) -> bytes:
    return (bytes([i % 251]) + bytes(range(256)) * (size // 256 + 1))[:size]


class Records:
    def __init__(self, name: str, count: int, size: int) -> None:
        self.name, self.count, self.size = name, count, size

    def __iter__(self):
        import dataset_rt as drt

        for i in range(self.count):
            yield drt.CacheInput(blob(self.size, i), {"label": i % 10})


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def row(label: str, samples: int, nbytes: int, seconds: float, limit: float | None) -> float:
    rate = nbytes / seconds / 1e6
    share = f"{rate / limit:>6.0%}" if limit else "      "
    print(
        f"  {label:<34} {samples / seconds:>11,.0f} samples/s {rate:>8,.1f} MB/s {share}"
        f"   (rss {peak_rss_mib():,.0f} MiB)",
        flush=True,
    )
    return rate


def raw_fetch(url: str, fetchers: int) -> tuple[float, int]:
    """Seconds and bytes to fetch every object under ``url`` in 8 MiB ranges."""
    import obstore

    from dataset_rt.remote import ObstoreTransport

    transport = ObstoreTransport()
    store, prefix = transport.locate(url)
    metas = [m for batch in obstore.list(store, prefix) for m in batch]
    ranges = [
        (m["path"], start, min(m["size"], start + 8 * MiB))
        for m in metas
        for start in range(0, max(m["size"], 1), 8 * MiB)
    ]
    start = time.perf_counter()
    with ThreadPoolExecutor(fetchers) as pool:
        total = sum(
            pool.map(lambda r: len(obstore.get_range(store, r[0], start=r[1], end=r[2])), ranges)
        )
    return time.perf_counter() - start, total


def read_all(dataset, batch: int) -> int:
    return sum(len(b) for b in dataset.iter_batches(batch, copy=False))


# ------------------------------------------------------------------ LitData (own venv)


def run_litdata_side(spec: dict) -> None:
    """In the LitData virtualenv: optimize the records locally, upload them to the
    server, stream them back; prints JSON {mode: [seconds, samples]}."""
    import functools

    import boto3
    import litdata as ld
    from litdata.streaming import downloader

    # LitData's obstore client options replace the environment's AWS_ALLOW_HTTP: the
    # loopback server speaks plain HTTP, so allow it the way our transport does.
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True

    ld.optimize(
        fn=functools.partial(_litdata_sample, size=spec["size"]),
        inputs=list(range(spec["count"])),
        output_dir=spec["dir"],
        chunk_bytes="64MB",
        num_workers=1,
    )
    s3 = boto3.client("s3")
    for path in Path(spec["dir"]).iterdir():
        s3.upload_file(str(path), "bench", f"litdata/{spec['name']}/{path.name}")
    results = {}
    for shuffle in (False, True):
        cache_dir = tempfile.mkdtemp(prefix="litdata-cache-")
        dataset = ld.StreamingDataset(
            f"s3://bench/litdata/{spec['name']}", shuffle=shuffle, seed=1, cache_dir=cache_dir
        )
        loader = ld.StreamingDataLoader(dataset, batch_size=spec["batch"], num_workers=0)
        start = time.perf_counter()
        n = sum(len(b["label"]) for b in loader)
        results["shuffled" if shuffle else "ordered"] = [time.perf_counter() - start, n]
    print(json.dumps(results))


def _litdata_sample(index: int, size: int = 0) -> dict:
    import numpy as np

    return {"data": np.frombuffer(blob(size, index), dtype=np.uint8), "label": index % 10}


def litdata_rates(env, server_env: dict, name: str, size: int, count: int, batch: int):
    work = Path(tempfile.mkdtemp(prefix="litdata-bench-"))
    spec = {"dir": str(work / "out"), "size": size, "count": count, "batch": batch, "name": name}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | server_env
    proc = subprocess.run(
        [str(env.python), __file__, "--litdata-side", json.dumps(spec)],
        env=clean,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if proc.returncode != 0:
        Path("/tmp/litdata-bench-stderr.txt").write_text(proc.stderr)
        lines = [x for x in proc.stderr.splitlines() if x.strip().endswith(("Error", "error"))]
        raise RuntimeError((lines or proc.stderr.splitlines() or ["failed"])[-1][-600:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ main


def measure(name: str, count: int, size: int, args, server, lit_env) -> None:
    import dataset_rt as drt

    print(f"\n{name}: {count:,} x {size:,} B records", flush=True)
    work = Path(tempfile.mkdtemp(prefix=f"drt-remote-{name}-"))
    runtime = drt.DatasetRuntime(num_workers=args.workers)
    writer = drt.WriterConfig(show_progress=False, max_shard_bytes=args.shard_mib * MiB)
    source = Records(name.lower(), count, size)
    runtime.write_cache(source, work / "local", writer_config=writer)
    url_base = f"s3://bench/{name.lower()}-{os.getpid()}"
    result = runtime.write_cache(source, url_base, writer_config=writer)
    if not isinstance(result[0], drt.CacheWriteSuccess):
        raise RuntimeError(result[0])
    url = result[0].path
    nbytes = count * size
    warm_up = runtime.cached_dataset(
        [work / "local" / source.name], reader_config=drt.ReaderConfig(seed=0)
    )
    read_all(warm_up, 64)  # imports (numpy, Polars) and page cache before any timed row
    seconds, fetched = raw_fetch(url, args.fetchers)
    limit = row(f"raw parallel fetch ({args.fetchers} threads)", count, fetched, seconds, None)
    batch = 4096 if size < 64 * 1024 else 64
    for shuffle in (False, True):
        mode = "shuffled" if shuffle else "ordered"
        config = drt.ReaderConfig(seed=1, shuffle=shuffle, prefetch_size=batch * 2)
        os.environ["DATASET_RT_CACHE_DIR"] = str(work / f"shard-cache-{mode}")
        for temperature in ("cold", "warm"):
            dataset = runtime.cached_dataset([url], reader_config=config)
            start = time.perf_counter()
            n = read_all(dataset, batch)
            row(f"remote {mode} {temperature}", n, nbytes, time.perf_counter() - start, limit)
        local = runtime.cached_dataset([work / "local" / source.name], reader_config=config)
        read_all(local, batch)  # page cache warm
        start = time.perf_counter()
        n = read_all(local, batch)
        row(f"local {mode}", n, nbytes, time.perf_counter() - start, limit)
    if lit_env is not None:
        try:
            rates = litdata_rates(lit_env, server.env(), name.lower(), size, count, batch)
            for mode, (seconds, n) in rates.items():
                row(f"litdata {mode} (0 workers)", n, n * size, seconds, limit)
        except Exception as exc:
            print(f"  litdata: not measured: {exc}")


def main() -> None:
    if "--litdata-side" in sys.argv:
        run_litdata_side(json.loads(sys.argv[sys.argv.index("--litdata-side") + 1]))
        return
    from remote_server import S3Server, client_env

    import dataset_rt as drt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--w1", type=int, default=200_000, help="W1 records (512 B)")
    parser.add_argument("--w2", type=int, default=1_000, help="W2 records (1 MiB)")
    parser.add_argument("--quick", action="store_true", help="W1 50,000 and W2 300")
    parser.add_argument("--workers", type=int, default=8, help="DatasetRuntime threads")
    parser.add_argument("--fetchers", type=int, default=8, help="raw fetch threads")
    parser.add_argument("--shard-mib", type=int, default=64, help="max_shard_bytes in MiB")
    parser.add_argument("--no-litdata", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.w1, args.w2 = 50_000, 300
    print(
        f"dataset_rt {drt.native_info()['version']}, {os.cpu_count()} CPUs, moto S3 server on "
        f"127.0.0.1; load average at start: {load()}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print("(last column: share of the raw parallel fetch of the same objects)")
    lit_env = None
    if not args.no_litdata:
        import refenv

        lit_env = refenv.ensure_extra(
            "litdata-0.2.76", (LITDATA, TORCH), "import litdata, torch; print('ok')"
        )
    server = S3Server()
    server.start()
    try:
        server.create_bucket("bench")
        with client_env(server.env()):
            measure("W1", args.w1, 512, args, server, lit_env)
            measure("W2", args.w2, MiB, args, server, lit_env)
    finally:
        server.stop()
    print(f"\nload average at end: {load()}")


if __name__ == "__main__":
    main()
