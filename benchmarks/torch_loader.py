"""Throughput of the PyTorch loader next to the dataset's own readers and LitData.

    uv run python benchmarks/torch_loader.py [--small N] [--large N] [--batch B] [--repeat R]
        [--no-litdata] [--quick]

torch is not in the uv environment: when it cannot be imported, the script re-runs itself
in the pip-made CPU-torch virtualenv the tests use (``tests/refenv.py``, built on first
use). LitData runs in a virtualenv of its own (``litdata`` and the same CPU torch,
built the same way), as a subprocess of this script.

For 512 B and 64 KiB records (``--small`` and ``--large`` samples of each), the same
records are written once as a dataset_rt cache and once as a LitData dataset (``optimize``;
each record a ``uint8`` array and an int label), in temporary directories read warm
(page cache), so the numbers are about per-sample and per-batch work, not the disk. Every
reader goes through the records in order (``shuffle=False``, ``worker_partition="global"``),
touching each batch's payloads and sample ids, and each line is the best of ``--repeat``
timed passes after one untimed pass (which also starts persistent workers), with the
median CPU time a sample took in all processes (the DataLoader workers and LitData's
side included). The timed passes are interleaved (one pass of every reader, LitData's
included, then the next round), so load from other work on the machine falls on every
line alike:

- ``iter_batches``: the dataset's own batch reader (numpy batches), the ceiling;
- ``loader samples``: ``to_torch_dataloader`` per sample (``CachedSample`` records and
  torch's default collate, dataset-rt 0.4.8's path) with 0 and 2 workers;
- ``loader tensors``: ``to_torch_dataloader(batch_format="tensors")`` with 0 and 2
  workers (fork);
- ``litdata``: LitData's ``StreamingDataLoader`` over ``StreamingDataset`` with 0 and 2
  workers.

The header and each section print the machine's load average: on a busy machine the
numbers mean little (compare lines of one run, not runs). ``--quick``: 50,000 and 4,096
samples, 3 repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
LITDATA = "litdata==0.2.76"
SIZES = (512, 64 * 1024)
REPLY = "@@torch_loader"  # marks the LitData side's replies on its stdout


def reexec_with_torch() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import refenv

    env = refenv.ensure_extra("torch-2.13.0", (TORCH,), "import torch; print('ok')")
    os.execve(str(env.python), [str(env.python), __file__, *sys.argv[1:]], env.environ())


def blob(size: int) -> bytes:
    return (bytes(range(256)) * (size // 256 + 1))[:size]


class Payloads:
    name = "bench_torch"

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size

    def __iter__(self):
        import dataset_rt as drt

        data = blob(self.size)
        for i in range(self.count):
            yield drt.CacheInput(data, {"label": i % 10})


def touch(batch: Any) -> int:
    """The samples of a batch, reading its payloads and sample ids."""
    return len(batch.sample_id) if batch.data is not None else 0


def tree_cpu_seconds() -> float:
    """CPU time (user + system) of this process and its live descendants so far (the
    DataLoader workers, the LitData side and its workers; Linux ``/proc``, else this
    process only). Per-process counters: a run's CPU is the difference of two calls
    while the same processes live (persistent workers do)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    pending, seen, total = [os.getpid()], set(), 0.0
    while pending:
        pid = pending.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{pid}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            if pid == os.getpid():
                usage = os.times()
                total += usage.user + usage.system
    return total


def interleaved(passes: int, runs: dict[str, Any]) -> dict[str, tuple[float, int, float]]:
    """For each ``runs[label]() -> (seconds, samples)``: the best of ``passes`` runs
    after one untimed run, the runs interleaved (round ``k`` runs every label once),
    with the median CPU seconds (all processes: ``tree_cpu_seconds``) of its runs,
    which says more than the time when other work shares the machine."""
    for run in runs.values():
        run()
    results: dict[str, tuple[float, int, float]] = {}
    cpu: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(passes):
        for label, run in runs.items():
            before = tree_cpu_seconds()
            seconds, count = run()
            cpu[label].append(tree_cpu_seconds() - before)
            if label not in results or seconds < results[label][0]:
                results[label] = (seconds, count, 0.0)
    for label, (seconds, count, _) in results.items():
        results[label] = (seconds, count, sorted(cpu[label])[len(cpu[label]) // 2])
    return results


def timed(run: Any) -> Any:
    """``run() -> samples`` as ``() -> (seconds, samples)``."""

    def inner() -> tuple[float, int]:
        start = time.perf_counter()
        count = run()
        return time.perf_counter() - start, count

    return inner


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def line(
    label: str, count: int, seconds: float, cpu: float, size: int, ceiling: float | None
) -> float:
    per_second = count / seconds
    share = f"{per_second / ceiling:>6.0%}" if ceiling else "      "
    print(
        f"  {label:<34} {per_second:>12,.0f} samples/s {per_second * size / 1e6:>8,.0f} MB/s "
        f"{share} {cpu / count * 1e6:>9,.2f} us CPU/sample",
        flush=True,
    )
    return per_second


# ------------------------------------------------------------------ LitData (own venv)


def litdata_env():
    sys.path.insert(0, str(ROOT / "tests"))
    import refenv

    return refenv.ensure_extra(
        "litdata-0.2.76", (LITDATA, TORCH), "import litdata, torch; print('ok')"
    )


def _litdata_sample(index: int, size: int = 0) -> dict:
    import numpy as np

    return {"data": np.frombuffer(blob(size), dtype=np.uint8), "label": index % 10}


def run_litdata_side(spec: dict) -> None:
    """In the LitData virtualenv: write ``spec["count"]`` records with ``optimize``, make
    ``StreamingDataLoader`` s with 0 and 2 workers, then serve passes: for each line
    ``W`` read from stdin, time one pass of the loader with ``W`` workers and print
    ``seconds samples``."""
    import functools

    import litdata as ld
    import torch

    torch.set_num_threads(1)
    out = spec["dir"]
    ld.optimize(
        fn=functools.partial(_litdata_sample, size=spec["size"]),
        inputs=list(range(spec["count"])),
        output_dir=out,
        chunk_bytes="64MB",
        num_workers=1,
    )
    loaders = {}
    for workers in (0, 2):
        dataset = ld.StreamingDataset(out, shuffle=False)
        loaders[workers] = ld.StreamingDataLoader(
            dataset, batch_size=spec["batch"], num_workers=workers, persistent_workers=workers > 0
        )
    print(REPLY, "ready", flush=True)
    for request in sys.stdin:
        if request.strip() == "quit":
            break
        loader = loaders[int(request)]
        start = time.perf_counter()
        count = 0
        for batch in loader:
            count += len(batch["label"]) if batch["data"] is not None else 0
        print(REPLY, time.perf_counter() - start, count, flush=True)


class LitData:
    """The LitData side (its own virtualenv) as a subprocess serving timed passes."""

    def __init__(self, env: Any, work: Path, size: int, count: int, batch: int) -> None:
        spec = {"dir": str(work / "litdata"), "size": size, "count": count, "batch": batch}
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        self.errors = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [str(env.python), __file__, "--litdata-side", json.dumps(spec)],
            env=clean,
            cwd=work,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
        )
        self._read()

    def _read(self) -> list[str]:
        """The next reply (other output of LitData's is skipped)."""
        while True:
            reply = self.proc.stdout.readline()  # type: ignore[union-attr]
            if not reply:
                self.proc.wait()
                self.errors.seek(0)
                raise RuntimeError(f"LitData run failed:\n{self.errors.read()[-4000:]}")
            if reply.startswith(REPLY):
                return reply.split()[1:]

    def run(self, workers: int) -> Any:
        def inner() -> tuple[float, int]:
            self.proc.stdin.write(f"{workers}\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            seconds, count = self._read()
            return float(seconds), int(count)

        return inner

    def close(self) -> None:
        # (Forked DataLoader workers hold the pipe too: EOF would never come.)
        self.proc.stdin.write("quit\n")  # type: ignore[union-attr]
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=600)
        self.errors.close()


# ------------------------------------------------------------------ dataset_rt


def measure(size: int, count: int, args, lit_env) -> None:
    import dataset_rt as drt

    print(
        f"\n{size} B records, {count:,} samples, batch {args.batch} "
        f"(load average {load_average()})",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="dataset_rt-bench-") as work:
        runtime = drt.DatasetRuntime(num_workers=2)
        result = runtime.from_cache_sources(
            Payloads(count, size),
            work,
            reader_config=drt.ReaderConfig(seed=1, shuffle=False),
            writer_config=drt.WriterConfig(show_progress=False),
        )
        dataset = result.dataset

        def batches() -> int:
            return sum(map(touch, dataset.iter_batches(args.batch)))

        runs: dict[str, Any] = {"dataset.iter_batches": timed(batches)}
        loaders = []
        for batch_format in ("samples", "tensors"):
            for workers in (0, 2):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    loader = dataset.to_torch_dataloader(
                        batch_size=args.batch,
                        shuffle=False,
                        worker_partition="global",
                        num_workers=workers,
                        multiprocessing_context="fork" if workers else "spawn",
                        native_num_workers=1,
                        verbose=False,
                        batch_format=batch_format,
                    )

                def run(loader=loader) -> int:
                    return sum(map(touch, loader))

                runs[f"loader {batch_format}, {workers} workers"] = timed(run)
                loaders.append(loader)
        litdata = None if lit_env is None else LitData(lit_env, Path(work), size, count, args.batch)
        if litdata is not None:
            for workers in (0, 2):
                runs[f"litdata StreamingDataLoader, {workers} workers"] = litdata.run(workers)
        try:
            results = interleaved(args.repeat, runs)
        finally:
            if litdata is not None:
                litdata.close()
        ceiling = None
        for label, (seconds, n, cpu) in results.items():
            rate = line(label, n, seconds, cpu, size, ceiling)
            ceiling = ceiling or rate
        print(f"  (load average after: {load_average()})", flush=True)
        del loaders


def main() -> None:
    if "--litdata-side" in sys.argv:
        run_litdata_side(json.loads(sys.argv[sys.argv.index("--litdata-side") + 1]))
        return
    try:
        import torch
    except ImportError:
        reexec_with_torch()
        return
    import dataset_rt as drt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=200_000, help="512 B records")
    parser.add_argument("--large", type=int, default=8192, help="64 KiB records")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-litdata", action="store_true")
    parser.add_argument("--quick", action="store_true", help="fewer samples (50,000 and 4,096)")
    args = parser.parse_args()
    if args.quick:
        args.small, args.large, args.repeat = 50_000, 4096, 3
    torch.set_num_threads(1)
    load = load_average()
    version = drt.native_info()["version"]
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, dataset_rt {version}, "
        f"{LITDATA}; load average at start: {load}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(
        "(columns: best of the timed passes; share of iter_batches; median CPU time of all "
        "processes (workers, LitData's side) per sample, in 10 ms ticks: on a busy machine "
        "it says more than the rate)"
    )
    lit_env = None if args.no_litdata else litdata_env()
    for size, count in zip(SIZES, (args.small, args.large)):
        measure(size, count, args, lit_env)
    print(f"\nload average at end: {load_average()}")


if __name__ == "__main__":
    main()
