"""Reading caches on object storage, from a loopback S3 server, next to the limits.

    uv run python benchmarks/remote.py                 # W1 200,000 x 512 B, W2 1,000 x 1 MiB
    uv run python benchmarks/remote.py --quick         # W1 50,000, W2 300
    uv run python benchmarks/remote.py --w1 50000 --w2 200 --no-litdata --workers 4
    uv run python benchmarks/remote.py --quick --w1 0 --no-litdata --rounds 5   # loaded machine

The S3 server is moto's standalone server on 127.0.0.1 (``tests/remote_server.py``, a dev
dependency), so the numbers measure the client side against one slow-ish Python server:
compare rows with each other, not with a cloud. For W1 and W2 the same records are written
once locally and uploaded with ``write_cache`` to ``s3://bench/...``; then, in one run:

- ``raw fetch``: every object of the cache fetched with the same client (obstore) by
  ``--fetchers`` threads, in 8 MiB ranges and as whole objects (one GET each): the limits
  of this client and server; then the whole-object fetch again, each object written to
  a new local file (what keeping a local copy costs on top, without hashing or reading
  it back). moto reads a whole object for every ranged GET, so on this
  server a GET costs CPU in proportion to the object, not the range: whole objects are
  several times faster than 8 MiB ranges here (on S3 they are not);
- ``page cache`` (measured and printed last, so that its writes do not weigh on the
  other rows): no network: the same bytes written from one reused buffer into new
  shard-sized files, over the same files again, and each after deleting one (see
  ``page_cache_writes``). On a virtual machine, pages the guest has not touched lately
  cost several times more to fill than pages just freed: every client that keeps a
  local copy (our shard cache, LitData's cache, the ``to files`` row) pays the
  ``new files`` cost on a cold read into a directory that evicts nothing, which the raw
  fetches to memory do not. Read the cold rows against it;
- ``remote ordered|shuffled cold``: ``iter_batches`` over the URL with an empty shard cache
  (a fresh ``DATASET_RT_CACHE_DIR``), ``warm``: the same again with the shard cache full;
- ``local ordered|shuffled``: the local copy (page cache warm), timed as the remote rows
  are: the first pass of a dataset just opened (the open is not timed in any row);
- ``litdata``: LitData 0.2.76 (its own virtualenv, ``tests/refenv.py``) streaming the same
  records, written with ``optimize`` and uploaded to the same server (unless
  ``--no-litdata``), ``StreamingDataLoader`` with 0 workers: LitData's obstore client
  options replace ``AWS_ALLOW_HTTP``, so the script allows plain HTTP in LitData's module
  state, which DataLoader worker processes would not see (its own prefetch threads
  still fetch in parallel). LitData rows print no rss (it runs in its own process).

With ``--rounds N`` (N > 1), each workload ends with N more rounds of the whole-object raw
fetch followed by a cold ordered read (a fresh shard cache each round), and one line of
their medians and spreads: on a loaded machine one pass of each row is noise (a 2-core VM
shared with other jobs gave cold ordered W2 at 37-90% of the raw fetch in one series),
while the median of the per-round ratios of the two is what moved.

Each line gives samples/s, MB/s and the share of the two raw fetches, then the CPU seconds per
GB read of the client (this process, or LitData's process) and of the moto server (its
process): on a 2-core machine the server and the client share the cores, so client CPU
per byte caps the throughput. The load average is printed at the start and the end; peak
RSS (VmHWM, of the whole run so far: it includes the raw fetches' whole objects and the
file pages of shards mapped while they download) after each row shows memory stays
bounded, not growing with the dataset.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
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


def self_cpu() -> float:
    """CPU seconds (user + system) of this process so far, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pid_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) of process ``pid`` so far (0 when unknown)."""
    if not pid:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Clock:
    """Wall time and the CPU time of this process and of the server between start and
    stop."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self.wall = time.perf_counter()
        self.cpu = self_cpu()
        self.server = pid_cpu(server_pid)

    def stop(self) -> tuple[float, float, float]:
        """(seconds, client CPU seconds, server CPU seconds)."""
        return (
            time.perf_counter() - self.wall,
            self_cpu() - self.cpu,
            pid_cpu(self.server_pid) - self.server,
        )


def row(
    label: str,
    samples: int,
    nbytes: int,
    seconds: float,
    limits: tuple[float, float] | None,
    cpu: tuple[float, float] | None = None,
    rss: bool = True,
) -> float:
    """Prints one result line; ``limits`` are the two raw fetch rates (8 MiB ranges, whole
    objects), ``cpu`` is (client, server) CPU seconds of the run."""
    rate = nbytes / seconds / 1e6
    share = f"{rate / limits[0]:>5.0%} {rate / limits[1]:>5.0%}" if limits else " " * 11
    gb = nbytes / 1e9
    cpu_text = f"   cpu s/GB client {cpu[0] / gb:>5.2f} server {cpu[1] / gb:>5.2f}" if cpu else ""
    rss_text = f"   (rss {peak_rss_mib():,.0f} MiB)" if rss else ""
    print(
        f"  {label:<34} {samples / seconds:>11,.0f} samples/s {rate:>8,.1f} MB/s {share}"
        f"{cpu_text}{rss_text}",
        flush=True,
    )
    return rate


def raw_fetch(
    url: str,
    fetchers: int,
    server_pid: int | None,
    whole: bool,
    to_dir: Path | None = None,
) -> tuple[tuple[float, float, float], int]:
    """(seconds, client CPU, server CPU) and bytes to fetch every object under ``url`` by
    ``fetchers`` threads: in 8 MiB ranges, or (``whole``) one GET per object; with
    ``to_dir`` (whole objects only), each object is written to a new file there, as a
    client that keeps a local copy must (no hashing, no reading back)."""
    import obstore

    from dataset_rt.remote import ObstoreTransport

    transport = ObstoreTransport()
    store, prefix = transport.locate(url)
    metas = [m for batch in obstore.list(store, prefix) for m in batch]
    if whole:
        ranges = [(m["path"], 0, m["size"]) for m in metas]
    else:
        ranges = [
            (m["path"], start, min(m["size"], start + 8 * MiB))
            for m in metas
            for start in range(0, max(m["size"], 1), 8 * MiB)
        ]

    def fetch(item: tuple[str, int, int]) -> int:
        data = obstore.get_range(store, item[0], start=item[1], end=item[2])
        if to_dir is not None:
            with open(to_dir / item[0].replace("/", "_"), "wb") as out:
                out.write(memoryview(data))
        return len(data)

    if to_dir is not None:
        to_dir.mkdir(parents=True, exist_ok=True)
    clock = Clock(server_pid)
    with ThreadPoolExecutor(fetchers) as pool:
        total = sum(pool.map(fetch, ranges))
    return clock.stop(), total


def page_cache_writes(directory: Path, nbytes: int, file_bytes: int) -> list[tuple[str, float]]:
    """What keeping a local copy costs in the page cache alone, without any network or
    hash: ``nbytes`` written from one reused 1 MiB buffer (as the transport's pieces
    are) by ``os.pwrite`` into files of ``file_bytes`` (a shard), three ways:

    - ``new files``: new page-cache pages, as a cold shard cache fills;
    - ``same files again``: pages already in the page cache (a file rewritten in place);
    - ``after deleting one``: each file written just after another of the same size
      was deleted, as a download right after an eviction (the pages just freed).

    Returns (label, client CPU seconds) per case. The last files stay until the
    workload's directory is removed, so no freed pages are handed to a later row."""
    directory.mkdir(parents=True, exist_ok=True)
    piece = bytes(range(256)) * (MiB // 256)
    sizes = [min(file_bytes, nbytes - start) for start in range(0, nbytes, file_bytes)]

    def write(path: Path, size: int, flags: int) -> None:
        fd = os.open(path, os.O_WRONLY | flags, 0o644)
        try:
            for at in range(0, size, MiB):
                os.pwrite(fd, piece[: min(MiB, size - at)], at)
        finally:
            os.close(fd)

    results = []
    for label in ("new files", "same files again", "after deleting one"):
        clock = Clock(None)
        for i, size in enumerate(sizes):
            if label == "new files":
                write(directory / f"a{i}", size, os.O_CREAT | os.O_EXCL)
            elif label == "same files again":
                write(directory / f"a{i}", size, 0)
            else:
                (directory / f"a{i}").unlink()
                write(directory / f"b{i}", size, os.O_CREAT | os.O_EXCL)
        results.append((label, clock.stop()[1]))
    return results


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
        clock = Clock(spec.get("server_pid"))
        n = sum(len(b["label"]) for b in loader)
        seconds, client, server = clock.stop()
        results["shuffled" if shuffle else "ordered"] = [seconds, n, client, server]
        shutil.rmtree(cache_dir, ignore_errors=True)
    print(json.dumps(results))


def _litdata_sample(index: int, size: int = 0) -> dict:
    import numpy as np

    return {"data": np.frombuffer(blob(size, index), dtype=np.uint8), "label": index % 10}


def litdata_rates(
    env, server_env: dict, server_pid: int | None, name: str, size: int, count: int, batch: int
):
    work = Path(tempfile.mkdtemp(prefix="litdata-bench-"))
    spec = {
        "dir": str(work / "out"),
        "size": size,
        "count": count,
        "batch": batch,
        "name": name,
        "server_pid": server_pid,
    }
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | server_env
    try:
        proc = subprocess.run(
            [str(env.python), __file__, "--litdata-side", json.dumps(spec)],
            env=clean,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if proc.returncode != 0:
        Path("/tmp/litdata-bench-stderr.txt").write_text(proc.stderr)
        lines = [x for x in proc.stderr.splitlines() if x.strip().endswith(("Error", "error"))]
        raise RuntimeError((lines or proc.stderr.splitlines() or ["failed"])[-1][-600:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ main


def measure(name: str, count: int, size: int, args, server, lit_env) -> None:
    """Prints the rows of one workload; its local files (the local copy, the shard
    caches, the raw fetch's files: over a GB for W2) are removed afterwards."""
    print(f"\n{name}: {count:,} x {size:,} B records", flush=True)
    work = Path(tempfile.mkdtemp(prefix=f"drt-remote-{name}-"))
    saved = os.environ.get("DATASET_RT_CACHE_DIR")
    os.environ["DATASET_RT_CACHE_DIR"] = str(work / "local-cache")  # write_cache's staging
    try:
        _measure(work, name, count, size, args, server, lit_env)
    finally:
        if saved is None:
            os.environ.pop("DATASET_RT_CACHE_DIR", None)
        else:
            os.environ["DATASET_RT_CACHE_DIR"] = saved
        shutil.rmtree(work, ignore_errors=True)


def _measure(work: Path, name: str, count: int, size: int, args, server, lit_env) -> None:
    import dataset_rt as drt

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
    server_pid = server.process.pid if server.process else None
    rates = []
    for whole in (False, True):
        (seconds, client, server_cpu), fetched = raw_fetch(url, args.fetchers, server_pid, whole)
        what = "whole objects" if whole else "8 MiB ranges"
        label = f"raw fetch, {what} ({args.fetchers} thr)"
        rates.append(row(label, count, fetched, seconds, None, (client, server_cpu)))
    limit = (rates[0], rates[1])
    # The same whole-object fetch writing each object to a new local file: what any
    # client keeping a local copy (a shard cache, LitData's cache) pays on top.
    (seconds, client, server_cpu), fetched = raw_fetch(
        url, args.fetchers, server_pid, True, to_dir=work / "raw-files"
    )
    label = f"raw fetch, whole, to files ({args.fetchers} thr)"
    row(label, count, fetched, seconds, limit, (client, server_cpu))
    batch = 4096 if size < 64 * 1024 else 64
    for shuffle in (False, True):
        mode = "shuffled" if shuffle else "ordered"
        config = drt.ReaderConfig(seed=1, shuffle=shuffle, prefetch_size=batch * 2)
        os.environ["DATASET_RT_CACHE_DIR"] = str(work / f"shard-cache-{mode}")
        for temperature in ("cold", "warm"):
            dataset = runtime.cached_dataset([url], reader_config=config)
            clock = Clock(server_pid)
            n = read_all(dataset, batch)
            seconds, client, server_cpu = clock.stop()
            row(f"remote {mode} {temperature}", n, nbytes, seconds, limit, (client, server_cpu))
            del dataset
        local_path = work / "local" / source.name
        read_all(runtime.cached_dataset([local_path], reader_config=config), batch)  # page cache
        # Timed as the remote rows are: the first pass of a dataset just opened (not timed).
        local = runtime.cached_dataset([local_path], reader_config=config)
        clock = Clock(server_pid)
        n = read_all(local, batch)
        seconds, client, server_cpu = clock.stop()
        row(f"local {mode}", n, nbytes, seconds, limit, (client, server_cpu))
    if args.rounds > 1:
        cold_rounds(work, url, count, nbytes, args, runtime, server_pid)
    if lit_env is not None:
        try:
            rates = litdata_rates(
                lit_env, server.env(), server_pid, name.lower(), size, count, batch
            )
            for mode, (seconds, n, client, server_cpu) in rates.items():
                row(
                    f"litdata {mode} (0 workers)",
                    n,
                    n * size,
                    seconds,
                    limit,
                    (client, server_cpu),
                    rss=False,
                )
        except Exception as exc:
            print(f"  litdata: not measured: {exc}")
    # What the page cache alone costs a client that keeps a local copy (no network, no
    # hash): on a virtual machine, pages the guest has not touched recently cost far
    # more to fill than pages freed a moment ago. Read the cold rows against it. Measured
    # last, so that its writes (and their writeback) do not weigh on the other rows.
    for what, cpu in page_cache_writes(work / "page-cache", nbytes, args.shard_mib * MiB):
        print(
            f"  {'page cache: ' + what:<34} {'(no network)':>21} {'':>14} {'':>11}"
            f"   cpu s/GB client {cpu / (nbytes / 1e9):>5.2f}",
            flush=True,
        )


def spread(values: list[float], fmt: str) -> str:
    """``median [min-max]`` of ``values``, each formatted with ``fmt``."""
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def cold_rounds(work: Path, url: str, count: int, nbytes: int, args, runtime, server_pid) -> None:
    """``--rounds``: ``args.rounds`` times the whole-object raw fetch, then a cold ordered
    read of ``url`` into a fresh shard cache (removed after the round); prints the
    medians and spreads of the cold rate, its share of the raw fetch of the same round,
    and the client's and server's CPU seconds per GB."""
    import dataset_rt as drt

    batch = 4096 if nbytes // max(count, 1) < 64 * 1024 else 64
    config = drt.ReaderConfig(seed=1, shuffle=False, prefetch_size=batch * 2)
    rates, shares, client, server = [], [], [], []
    for r in range(args.rounds):
        (raw_seconds, _, _), fetched = raw_fetch(url, args.fetchers, server_pid, True)
        shard_cache = work / f"shard-cache-round-{r}"
        os.environ["DATASET_RT_CACHE_DIR"] = str(shard_cache)
        dataset = runtime.cached_dataset([url], reader_config=config)
        clock = Clock(server_pid)
        read_all(dataset, batch)
        seconds, client_cpu, server_cpu = clock.stop()
        del dataset
        shutil.rmtree(shard_cache, ignore_errors=True)
        rates.append(nbytes / seconds / 1e6)
        shares.append((nbytes / seconds) / (fetched / raw_seconds))
        client.append(client_cpu / (nbytes / 1e9))
        server.append(server_cpu / (nbytes / 1e9))
    print(
        f"  {f'remote ordered cold, {args.rounds} rounds':<34} MB/s {spread(rates, ',.1f')}"
        f"   share of raw whole {spread(shares, '.0%')}   cpu s/GB client "
        f"{spread(client, '.2f')} server {spread(server, '.2f')}",
        flush=True,
    )


def main() -> None:
    if "--litdata-side" in sys.argv:
        run_litdata_side(json.loads(sys.argv[sys.argv.index("--litdata-side") + 1]))
        return
    from remote_server import S3Server, client_env

    import dataset_rt as drt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--w1", type=int, default=200_000, help="W1 records (512 B)")
    parser.add_argument("--w2", type=int, default=1_000, help="W2 records (1 MiB)")
    parser.add_argument(
        "--quick", action="store_true", help="W1 50,000 and W2 300 (unless given; 0 skips one)"
    )
    parser.add_argument("--workers", type=int, default=8, help="DatasetRuntime threads")
    parser.add_argument("--fetchers", type=int, default=8, help="raw fetch threads")
    parser.add_argument("--shard-mib", type=int, default=64, help="max_shard_bytes in MiB")
    parser.add_argument("--no-litdata", action="store_true")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="N > 1: N more rounds of raw fetch + cold ordered read, printed as medians",
    )
    args = parser.parse_args()
    if args.quick:
        given = " ".join(sys.argv)
        args.w1 = args.w1 if "--w1" in given else 50_000
        args.w2 = args.w2 if "--w2" in given else 300
    print(
        f"dataset_rt {drt.native_info()['version']}, {os.cpu_count()} CPUs, moto S3 server on "
        f"127.0.0.1; load average at start: {load()}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(
        "(the two % columns: share of the raw parallel fetch of the same objects with the same"
        " client, in 8 MiB ranges and as whole objects)"
    )
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
            if args.w1 > 0:
                measure("W1", args.w1, 512, args, server, lit_env)
            if args.w2 > 0:
                measure("W2", args.w2, MiB, args, server, lit_env)
    finally:
        server.stop()
    print(f"\nload average at end: {load()}")


if __name__ == "__main__":
    main()
